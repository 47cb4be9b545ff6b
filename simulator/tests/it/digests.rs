//! Digest checkpoints cost what the state holds (consumed executions included): their cadence
//! follows the state's size, so over a run the items hashed stay a bounded number per entry
//! and a run's cost grows with its length, not its square.

use gyre_event::EventBody;
use gyre_simulator::{preset_rows, simulate, Preset, PresetOverrides};
use gyre_state::{ControlState, DIGEST_ITEMS_PER_ENTRY};

#[test]
fn digest_work_per_entry_stays_bounded_over_a_long_run() {
    let rows = preset_rows(Preset::Table2, 1, PresetOverrides::default());
    let mut config = rows
        .into_iter()
        .find(|row| row.id == "E0")
        .expect("table2 has E0")
        .config;
    config.steps = 48;
    let output = simulate(&config);
    // Fold the log as replay does; at each checkpoint, the items its digest hashes.
    let mut state = ControlState::new();
    let (mut entries, mut hashed, mut digests) = (0u64, 0u64, 0u64);
    for entry in output.entries() {
        entries += 1;
        for event in entry {
            if let EventBody::ProjectionDigest { hash, .. } = &event.body {
                hashed += state.digest_items();
                digests += 1;
                assert_eq!(&state.digest(), hash, "the checkpoint verifies");
            }
            let _ = state.apply(event);
        }
    }
    assert!(digests > 0, "checkpoints are written");
    assert!(
        state.digest_items() > 64 * DIGEST_ITEMS_PER_ENTRY,
        "the run grows past the fixed cadence's reach: {} items",
        state.digest_items()
    );
    assert!(
        hashed <= DIGEST_ITEMS_PER_ENTRY * entries,
        "{hashed} items hashed over {entries} entries ({digests} checkpoints)"
    );
}
