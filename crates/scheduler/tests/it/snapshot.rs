//! The scheduler projection's snapshot encoding, on states the random runtime of
//! `properties.rs` reaches: they round-trip exactly (same state, same digest, same bytes), the
//! restored state folds the rest of the log to the same state and digest as the original, and
//! cut, flipped or arbitrary bytes are refused or decode canonically — never a panic.

use gyre_event::wire::{Reader, WireError, WireErrorKind, Writer};
use gyre_event::SchedulingMode;
use gyre_scheduler::SchedulerState;
use proptest::prelude::*;

use crate::properties::{action, setup, Action, Runtime, Setup};

fn encode(state: &SchedulerState) -> Vec<u8> {
    let mut writer = Writer::new();
    state.encode_into(&mut writer);
    writer.into_bytes()
}

fn decode(bytes: &[u8]) -> Result<SchedulerState, WireError> {
    let mut reader = Reader::new(bytes);
    let state = SchedulerState::decode_from(&mut reader)?;
    reader.finish("end")?;
    Ok(state)
}

/// Whatever decodes must re-encode to exactly the bytes it came from (one state, one
/// encoding); anything else must be an error. Reaching the end at all means no panic.
fn check_refused_or_canonical(bytes: &[u8]) -> Result<(), String> {
    match decode(bytes) {
        Err(_) => Ok(()),
        Ok(state) if encode(&state) == bytes => Ok(()),
        Ok(_) => Err("accepted bytes that do not re-encode to themselves".into()),
    }
}

fn reached_state(setup: &Setup, actions: &[Action]) -> Runtime {
    let mut runtime = Runtime::new(setup);
    for action in actions {
        runtime.act(action);
    }
    runtime
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// decode(encode(s)) == s with the same digest and bytes, and folding the rest of the log
    /// into the restored state reaches the original's state and digest.
    #[test]
    fn snapshot_round_trips_and_folding_continues(
        setup in setup(),
        before in prop::collection::vec(action(), 0..120),
        after in prop::collection::vec(action(), 0..120),
    ) {
        let mut runtime = reached_state(&setup, &before);
        let bytes = encode(&runtime.state);
        let restored = decode(&bytes).expect("a snapshot of a reached state decodes");
        prop_assert_eq!(&restored, &runtime.state);
        prop_assert_eq!(restored.digest(), runtime.state.digest());
        prop_assert_eq!(&encode(&restored), &bytes, "re-encoding gives the same bytes");
        prop_assert_eq!(&encode(&runtime.state.clone()), &bytes, "encoding is deterministic");
        let logged = runtime.log.len();
        for action in &after {
            runtime.act(action);
        }
        let mut continued = restored;
        let mut resolutions = runtime.resolutions_at(logged);
        for event in &runtime.log[logged..] {
            continued.apply(event).expect("the rest of the log folds into the restored state");
            resolutions
                .after(&mut continued, event)
                .expect("the rest of the resolutions fold into the restored state");
        }
        prop_assert_eq!(&continued, &runtime.state);
        prop_assert_eq!(continued.digest(), runtime.state.digest());
    }

    /// A strict prefix is always refused; flipped bits and arbitrary bytes are refused or decode
    /// to a state that re-encodes to them.
    #[test]
    fn mangled_snapshots_are_refused_or_canonical(
        setup in setup(),
        actions in prop::collection::vec(action(), 0..80),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
        garbage in prop::collection::vec(any::<u8>(), 0..96),
    ) {
        let bytes = encode(&reached_state(&setup, &actions).state);
        prop_assert!(decode(&bytes[..cut.index(bytes.len())]).is_err());
        let mut flipped = bytes.clone();
        for (position, bit) in &flips {
            flipped[position.index(bytes.len())] ^= 1 << bit;
        }
        prop_assert_eq!(check_refused_or_canonical(&flipped), Ok(()));
        let mut extended = bytes.clone();
        extended.extend_from_slice(&garbage);
        prop_assert_eq!(decode(&extended).is_ok(), garbage.is_empty());
        prop_assert_eq!(check_refused_or_canonical(&garbage), Ok(()));
    }
}

fn busy_state() -> SchedulerState {
    let setup = Setup {
        mode: SchedulingMode::Elastic,
        streaming: true,
        phi_groups: 2,
        mu: 2,
        n: 2,
        b: 2,
        rho_min: 0.5,
        tau_s: 0,
        cells: 3,
        capacity: 2,
        standalone: 2,
        async_cells: 1,
    };
    let mut runtime = Runtime::new(&setup);
    runtime.drain(40, 3);
    runtime.act(&Action::Close(3, 0));
    runtime.act(&Action::Pack(1));
    assert!(
        runtime.state.training_version.get() >= 3,
        "the fixture trained"
    );
    runtime.state
}

/// Exhaustive on one busy state: every truncation is refused, every single-bit flip is refused
/// or decodes canonically.
#[test]
fn every_truncation_and_bit_flip_of_a_busy_state() {
    let state = busy_state();
    let bytes = encode(&state);
    assert_eq!(decode(&bytes).as_ref(), Ok(&state));
    for cut in 0..bytes.len() {
        assert!(
            decode(&bytes[..cut]).is_err(),
            "prefix of {cut} bytes accepted"
        );
    }
    for position in 0..bytes.len() {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[position] ^= 1 << bit;
            assert_eq!(
                check_refused_or_canonical(&flipped),
                Ok(()),
                "bit {bit} of byte {position}"
            );
        }
    }
}

/// An error names the field and the absolute byte offset of the bad value.
#[test]
fn errors_name_the_field_and_offset() {
    let mut bytes = encode(&SchedulerState::new());
    bytes[0] = 2;
    let error = decode(&bytes).expect_err("2 is not a flag");
    assert_eq!(error.field, "scheduler.config");
    assert_eq!(error.offset, 0);
    assert_eq!(error.kind, WireErrorKind::UnknownTag { tag: 2 });

    let state = busy_state();
    let bytes = encode(&state);
    let error = decode(&bytes[..bytes.len() - 1]).expect_err("cut short");
    assert_eq!(error.field, "scheduler.run_complete");
    assert_eq!(error.offset, bytes.len() - 1);
    assert!(
        matches!(error.kind, WireErrorKind::Truncated { .. }),
        "{error}"
    );
}
