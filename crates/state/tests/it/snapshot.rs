//! `ControlState`'s snapshot encoding on simulated runs with recorded model calls.
//!
//! The simulator's log has no model calls, so every started execution gets the calls of a
//! seeded synthetic execution (compaction, a sub-agent, retries) right after its start, and the
//! run ends with the admissions the buffer decides. At checkpoints along that log the state
//! round-trips (same state, digest and bytes) and folding the rest of the log into the restored
//! state reaches the original's state and digest. Every truncation and every bit flip of a
//! snapshot is refused (the checksum), arbitrary bytes are refused, and bodies mangled behind a
//! recomputed checksum are refused or decode canonically; none of it panics.

use gyre_event::{Event, EventBody, ExecutionId};
use gyre_state::{ControlState, SnapshotDecodeError, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC};
use gyre_trajectory::synthetic::{context_call, generate, SyntheticConfig};
use gyre_trajectory::{record_from_context, RoleClasses, SplitMix64, Tree, TreeConfig};
use sha2::{Digest, Sha256};

use crate::fold::simulated_run;

const HEADER_BYTES: usize = 12;
const CHECKSUM_BYTES: usize = 32;

/// Executions a little closer to real ones in size than `SyntheticConfig::small`.
fn sized_executions() -> SyntheticConfig {
    SyntheticConfig {
        main_calls: 10,
        sub_agents: 1,
        sub_agent_calls: 4,
        system_prompt_tokens: 300,
        input_tokens: (20, 200),
        output_tokens: (10, 120),
        summary_output_tokens: 60,
        compaction_context_tokens: 2_500,
        retry_per_mille: 50,
    }
}

/// A simulated run with every execution's model calls recorded after its start, and the
/// admissions the buffer decides before every optimizer step (as the controller admits before
/// packing) and at the end.
fn run_with_model_calls(seed: u64, steps: u32, calls: &SyntheticConfig) -> Vec<Event> {
    let mut events = Vec::new();
    let mut state = ControlState::new();
    let push = |events: &mut Vec<Event>, state: &mut ControlState, event: Event| {
        state.apply(&event).expect("every event applies");
        events.push(event);
    };
    let admit = |state: &ControlState| {
        let config = state.scheduler.config().expect("the run started").clone();
        state.trajectories.decide_admissions(
            config.run_seed,
            config.j_max,
            &RoleClasses::claude_code(),
        )
    };
    let mut admitted = 0;
    for event in simulated_run(seed, steps) {
        let at = event.at;
        if let EventBody::OptimizerStepped { .. } = event.body {
            for body in admit(&state) {
                admitted += 1;
                push(&mut events, &mut state, Event::new(at, body));
            }
        }
        let started = match &event.body {
            EventBody::ExecutionStarted { execution, .. } => Some(*execution),
            _ => None,
        };
        push(&mut events, &mut state, event);
        if let Some(execution) = started {
            for body in model_calls(execution, calls, seed) {
                push(&mut events, &mut state, Event::new(at, body));
            }
        }
    }
    let at = events.last().expect("events").at;
    for body in admit(&state) {
        admitted += 1;
        push(&mut events, &mut state, Event::new(at, body));
    }
    assert!(admitted > 0, "some groups were admitted");
    events
}

fn model_calls(execution: ExecutionId, config: &SyntheticConfig, seed: u64) -> Vec<EventBody> {
    let mut tree = Tree::new(execution, TreeConfig::default());
    generate(config.clone(), seed ^ execution.get())
        .iter()
        .map(|call| {
            let record = record_from_context(&tree, &context_call(call));
            tree.apply(&record).expect("generated calls apply");
            EventBody::ModelCall(Box::new(record))
        })
        .collect()
}

fn fold(events: &[Event]) -> ControlState {
    let mut state = ControlState::new();
    for event in events {
        state.apply(event).expect("every event applies");
    }
    state
}

fn reseal(bytes: &mut [u8]) {
    let covered = bytes.len() - CHECKSUM_BYTES;
    let sum: [u8; 32] = Sha256::digest(&bytes[..covered]).into();
    bytes[covered..].copy_from_slice(&sum);
}

/// `state`'s snapshot as an older `version` (1 to 3) wrote it: the stored-responses section
/// (empty here: one zero count byte after `events_applied`) and the trajectory part's last
/// `sections` sections (each empty here: one zero count byte; they sit just before
/// `events_applied`) left out, the version set, the checksum redone.
fn as_older_version(state: &ControlState, sections: usize, version: u32) -> Vec<u8> {
    assert!(
        state.responses.is_empty(),
        "the fixture stores no responses (none before version 4)"
    );
    let bytes = state.encode_snapshot();
    let mut applied = gyre_event::wire::Writer::new();
    applied.varint(state.events_applied);
    let applied_bytes = applied.into_bytes().len();
    let body_end = bytes.len() - CHECKSUM_BYTES;
    assert_eq!(
        bytes[body_end - 1],
        0,
        "the stored-responses section is empty"
    );
    let sections_end = body_end - 1 - applied_bytes;
    assert!(
        bytes[sections_end - sections..sections_end]
            .iter()
            .all(|count| *count == 0),
        "the left-out sections are empty"
    );
    let mut older = bytes[..sections_end - sections].to_vec();
    // Version 4 on keeps the (empty) stored-responses section.
    let responses_end = if version >= 4 { body_end } else { body_end - 1 };
    older.extend_from_slice(&bytes[sections_end..responses_end]);
    older.extend_from_slice(&bytes[body_end..]);
    older[8..12].copy_from_slice(&version.to_le_bytes());
    reseal(&mut older);
    older
}

/// Refused, or decoded to a state that re-encodes to exactly these bytes.
fn assert_refused_or_canonical(bytes: &[u8]) {
    if let Ok(state) = ControlState::decode_snapshot(bytes) {
        assert!(
            state.encode_snapshot() == bytes,
            "accepted bytes that do not re-encode to themselves"
        );
    }
}

#[test]
fn snapshot_round_trips_at_checkpoints_and_folding_continues() {
    let events = run_with_model_calls(3, 6, &SyntheticConfig::small(6, 1));
    let checkpoints: Vec<usize> = (0..=8).map(|i| i * events.len() / 8).collect();
    let mut state = ControlState::new();
    let mut restored = Vec::new();
    for (position, event) in events.iter().enumerate() {
        if checkpoints.contains(&position) {
            let bytes = state.encode_snapshot();
            let decoded = ControlState::decode_snapshot(&bytes).expect("a snapshot decodes");
            assert_eq!(decoded, state, "round trip at event {position}");
            assert_eq!(decoded.digest(), state.digest());
            assert_eq!(
                decoded.encode_snapshot(),
                bytes,
                "re-encoding gives the same bytes"
            );
            restored.push((position, decoded));
        }
        state.apply(event).expect("every event applies");
    }
    let final_bytes = state.encode_snapshot();
    let final_decoded = ControlState::decode_snapshot(&final_bytes).expect("decodes");
    assert_eq!(final_decoded, state);
    assert_eq!(final_decoded.digest(), state.digest());
    for (position, mut continued) in restored {
        for event in &events[position..] {
            continued
                .apply(event)
                .expect("the rest of the log folds into the restored state");
        }
        continued.validate().expect("the continued state is valid");
        assert_eq!(continued, state, "continued from event {position}");
        assert_eq!(continued.digest(), state.digest());
        assert_eq!(continued.encode_snapshot(), final_bytes);
    }
}

/// Optimizer steps retire the trees of the executions they consumed: the live trees are those
/// of executions not yet consumed, and every tree's counts (all the state digest reads of a
/// tree) equal those of a buffer that kept every tree, so the digest does not depend on
/// retirement and logs written before it replay to the same checkpoints.
#[test]
fn consumed_executions_retire_and_the_digest_does_not_depend_on_it() {
    let events = run_with_model_calls(11, 6, &SyntheticConfig::small(6, 1));
    let state = fold(&events);
    let mut kept = gyre_trajectory::TrajectoryBuffer::new(
        TreeConfig::default(),
        gyre_trajectory::ScoringConfig::default(),
    );
    for event in &events {
        if let EventBody::ModelCall(_) = event.body {
            kept.apply(event).expect("records apply");
        }
    }
    let buffer = &state.trajectories;
    assert!(!buffer.retired.is_empty(), "the run consumed groups");
    assert_eq!(
        buffer.trees.len() + buffer.retired.len(),
        kept.trees.len(),
        "every execution with records is live or retired"
    );
    assert_eq!(
        buffer.tree_counts().collect::<Vec<_>>(),
        kept.tree_counts().collect::<Vec<_>>()
    );
    let live_tokens: u64 = buffer.trees.values().map(|tree| tree.tokens_count()).sum();
    let all_tokens: u64 = kept.trees.values().map(|tree| tree.tokens_count()).sum();
    assert!(
        live_tokens < all_tokens,
        "retirement frees tokens: {live_tokens} of {all_tokens} kept"
    );
    // Every retired execution's group was consumed by the step it names.
    let consumed: std::collections::BTreeMap<_, _> = events
        .iter()
        .filter_map(|event| match &event.body {
            EventBody::OptimizerStepped { step, consumed, .. } => Some((step, consumed)),
            _ => None,
        })
        .flat_map(|(step, consumed)| consumed.iter().map(move |c| (c.group, *step)))
        .collect();
    for (execution, retired) in &buffer.retired {
        let group = buffer.scoring.executions[execution].group;
        assert_eq!(consumed.get(&group), Some(&retired.step), "{execution}");
    }
    let restored = ControlState::decode_snapshot(&state.encode_snapshot()).expect("decodes");
    assert_eq!(restored, state);
    assert_eq!(restored.digest(), state.digest());
}

/// A version-1 snapshot (written before retirement: every tree live, no retired sections)
/// restores to the state a fold of the same log reaches now, consumed executions retired, so
/// a node restored from one and a node that refolded agree on everything that follows.
#[test]
fn version_1_snapshots_restore_to_what_a_fold_reaches_now() {
    let events = run_with_model_calls(5, 3, &SyntheticConfig::small(4, 1));
    let state = fold(&events);
    assert!(
        !state.trajectories.retired.is_empty(),
        "the run consumed groups"
    );
    // What a build before retirement held after the same log: every tree kept.
    let mut old = state.clone();
    old.trajectories = ControlState::new().trajectories;
    for event in &events {
        if !matches!(event.body, EventBody::OptimizerStepped { .. }) {
            old.trajectories.apply(event).expect("the log folds");
        }
    }
    assert!(old.trajectories.retired.is_empty() && old.trajectories.consumed_groups.is_empty());
    // Version 6 ends its trajectory part with six sections (retired, retiring, consumed
    // groups, stop sequences, constrained outputs, frozen designations; empty here); version 1
    // has none of them.
    let v1 = as_older_version(&old, 6, 1);
    let restored = ControlState::decode_snapshot(&v1).expect("a version-1 snapshot restores");
    assert_eq!(restored, state);
    assert_eq!(restored.digest(), state.digest());
    assert_eq!(restored.encode_snapshot(), state.encode_snapshot());
}

/// A version-2 snapshot (written before nodes kept their calls' stop sequences: it has no such
/// section) restores to the same state, none of its calls with stop sequences.
#[test]
fn version_2_snapshots_restore_without_stop_sequences() {
    let events = run_with_model_calls(5, 3, &SyntheticConfig::small(4, 1));
    let state = fold(&events);
    let bytes = state.encode_snapshot();
    // Version 6 ends its trajectory part with the stop-sequence, constrained-output and
    // frozen-designation sections (empty here); version 2 has none of them.
    let v2 = as_older_version(&state, 3, 2);
    let restored = ControlState::decode_snapshot(&v2).expect("a version-2 snapshot restores");
    assert_eq!(restored, state);
    assert_eq!(restored.encode_snapshot(), bytes);
}

/// A version-3 snapshot (written before stored responses: no such section) restores to the
/// same state, holding none.
#[test]
fn version_3_snapshots_restore_without_stored_responses() {
    let events = run_with_model_calls(5, 3, &SyntheticConfig::small(4, 1));
    let state = fold(&events);
    let bytes = state.encode_snapshot();
    // Nor the constrained-output and frozen-designation sections (empty here).
    let v3 = as_older_version(&state, 2, 3);
    let restored = ControlState::decode_snapshot(&v3).expect("a version-3 snapshot restores");
    assert_eq!(restored, state);
    assert_eq!(restored.encode_snapshot(), bytes);
}

/// A version-4 snapshot (written before nodes kept how many outputs an answer-format grammar
/// constrained: no such section) restores to the same state, none of its calls constrained.
#[test]
fn version_4_snapshots_restore_without_context_outputs() {
    let events = run_with_model_calls(5, 3, &SyntheticConfig::small(4, 1));
    let state = fold(&events);
    let bytes = state.encode_snapshot();
    // Nor the frozen-designation section (empty here).
    let v4 = as_older_version(&state, 2, 4);
    let restored = ControlState::decode_snapshot(&v4).expect("a version-4 snapshot restores");
    assert_eq!(restored, state);
    assert_eq!(restored.encode_snapshot(), bytes);
}

/// A version-5 snapshot (written before designated results were frozen: no section of
/// designations that differ from the rule) restores to the same state, each designation the
/// one the rule gives.
#[test]
fn version_5_snapshots_restore_with_the_designations_the_rule_gives() {
    let events = run_with_model_calls(5, 3, &SyntheticConfig::small(4, 1));
    let state = fold(&events);
    let bytes = state.encode_snapshot();
    let v5 = as_older_version(&state, 1, 5);
    let restored = ControlState::decode_snapshot(&v5).expect("a version-5 snapshot restores");
    assert_eq!(restored, state);
    assert_eq!(restored.encode_snapshot(), bytes);
}

/// Stored responses survive a snapshot and count in the digest once one is stored.
#[test]
fn stored_responses_are_in_the_snapshot_and_the_digest() {
    let events = run_with_model_calls(5, 3, &SyntheticConfig::small(4, 1));
    let mut state = fold(&events);
    let before = state.digest();
    let open = (1..u64::MAX)
        .map(gyre_event::ExecutionId)
        .find(|execution| !state.execution_closed(*execution))
        .expect("an id no execution closed");
    let stored = |id: &str, previous: Option<&str>| {
        Event::new(
            gyre_event::Timestamp(u64::MAX / 2),
            EventBody::ResponseStored(Box::new(gyre_event::StoredResponseRecord {
                execution: open,
                response_id: id.into(),
                previous_response_id: previous.map(str::to_string),
                items: br#"{"type":"message","role":"user","content":"hi"}"#.to_vec(),
            })),
        )
    };
    state.apply(&stored("resp_a", None)).expect("a root");
    state
        .apply(&stored("resp_b", Some("resp_a")))
        .expect("its continuation");
    let error = state
        .apply(&stored("resp_c", Some("resp_x")))
        .expect_err("an unknown parent");
    assert!(
        error.to_string().contains("stored-responses projection"),
        "{error}"
    );
    assert_ne!(state.digest(), before);
    let bytes = state.encode_snapshot();
    let restored = ControlState::decode_snapshot(&bytes).expect("restores");
    assert_eq!(restored, state);
    assert_eq!(restored.digest(), state.digest());
    assert_eq!(restored.responses.executions[&open].records.len(), 2);
}

#[test]
fn snapshot_encoding_is_deterministic() {
    let events = run_with_model_calls(5, 3, &SyntheticConfig::small(6, 1));
    let first = fold(&events);
    let second = fold(&events);
    let bytes = first.encode_snapshot();
    assert_eq!(second.encode_snapshot(), bytes, "two folds, same bytes");
    assert_eq!(
        first.clone().encode_snapshot(),
        bytes,
        "a clone, same bytes"
    );
    assert_eq!(first.encode_snapshot(), bytes, "twice, same bytes");
    let shorter = fold(&events[..events.len() - 1]);
    assert_ne!(
        shorter.encode_snapshot(),
        bytes,
        "another state, other bytes"
    );
}

/// The checksum makes this exhaustive claim hold for every byte: no truncation and no single
/// flipped bit of a snapshot is accepted.
#[test]
fn every_truncation_and_bit_flip_is_refused() {
    let events = run_with_model_calls(3, 6, &SyntheticConfig::small(3, 0));
    let state = fold(&events[..events.len() / 10]);
    let bytes = state.encode_snapshot();
    assert!(bytes.len() > 1_000, "the fixture has some substance");
    for cut in 0..bytes.len() {
        assert!(
            ControlState::decode_snapshot(&bytes[..cut]).is_err(),
            "prefix of {cut} bytes accepted"
        );
    }
    for position in 0..bytes.len() {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[position] ^= 1 << bit;
            assert!(
                ControlState::decode_snapshot(&flipped).is_err(),
                "bit {bit} of byte {position} flipped and accepted"
            );
        }
    }
}

#[test]
fn unknown_versions_and_foreign_bytes_are_refused_by_name() {
    let bytes = ControlState::new().encode_snapshot();
    assert_eq!(&bytes[..8], &SNAPSHOT_MAGIC);
    assert_eq!(bytes[8..12], SNAPSHOT_FORMAT_VERSION.to_le_bytes());

    let mut future = bytes.clone();
    future[8..12].copy_from_slice(&(SNAPSHOT_FORMAT_VERSION + 1).to_le_bytes());
    reseal(&mut future);
    let error = ControlState::decode_snapshot(&future).expect_err("a future version");
    assert_eq!(
        error,
        SnapshotDecodeError::UnsupportedVersion {
            found: SNAPSHOT_FORMAT_VERSION + 1,
            supported: SNAPSHOT_FORMAT_VERSION
        }
    );
    assert!(
        error.to_string().contains(&format!(
            "format version {} is not supported",
            SNAPSHOT_FORMAT_VERSION + 1
        )),
        "{error}"
    );

    let error =
        ControlState::decode_snapshot(b"GYRE-CP1 and then some batches").expect_err("foreign");
    assert!(
        matches!(error, SnapshotDecodeError::BadMagic { .. }),
        "{error}"
    );
    assert!(ControlState::decode_snapshot(&[]).is_err());
    assert_eq!(
        ControlState::decode_snapshot(&bytes[..HEADER_BYTES + 3]),
        Err(SnapshotDecodeError::TooShort {
            length: HEADER_BYTES + 3
        })
    );

    // A body that does not end where the fields do names the offset.
    let mut padded = bytes[..bytes.len() - CHECKSUM_BYTES].to_vec();
    let end = padded.len();
    padded.extend_from_slice(&[0; 1 + CHECKSUM_BYTES]);
    reseal(&mut padded);
    let error = ControlState::decode_snapshot(&padded).expect_err("a trailing byte");
    assert!(
        error.to_string() == format!("malformed snapshot at byte {end}, field `end of body`: 1 bytes left after the last field"),
        "{error}"
    );
}

/// Seeded arbitrary bytes: with or without a valid header and checksum, refused or canonical.
#[test]
fn arbitrary_bytes_never_panic() {
    let mut rng = SplitMix64::new(0x5A17);
    for _ in 0..4_000 {
        let length = rng.below(400) as usize;
        let mut bytes: Vec<u8> = (0..length).map(|_| rng.next_u64() as u8).collect();
        assert!(
            ControlState::decode_snapshot(&bytes).is_err(),
            "random bytes accepted"
        );
        let mut framed = SNAPSHOT_MAGIC.to_vec();
        framed.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        framed.append(&mut bytes);
        framed.extend_from_slice(&[0; CHECKSUM_BYTES]);
        reseal(&mut framed);
        assert_refused_or_canonical(&framed);
    }
}

/// Bodies mangled behind a recomputed checksum reach every field decoder: random bit flips,
/// byte overwrites and cuts of a real snapshot are refused or decode canonically.
#[test]
fn mangled_bodies_behind_a_valid_checksum_are_refused_or_canonical() {
    let events = run_with_model_calls(7, 3, &SyntheticConfig::small(4, 1));
    let bytes = fold(&events[..events.len() * 2 / 3]).encode_snapshot();
    let mut rng = SplitMix64::new(0xB0D1);
    let mut accepted = 0;
    for round in 0..3_000 {
        let mut mangled = bytes.clone();
        for _ in 0..1 + rng.below(3) {
            let body_end = mangled.len() - CHECKSUM_BYTES;
            let position = HEADER_BYTES + rng.below((body_end - HEADER_BYTES) as u64) as usize;
            match round % 3 {
                0 => mangled[position] ^= 1 << rng.below(8),
                1 => mangled[position] = rng.next_u64() as u8,
                _ => {
                    let cut = 1 + rng.below(32) as usize;
                    mangled.drain(position..(position + cut).min(body_end));
                }
            }
        }
        reseal(&mut mangled);
        if let Ok(state) = ControlState::decode_snapshot(&mangled) {
            accepted += 1;
            assert!(
                state.encode_snapshot() == mangled,
                "round {round}: accepted non-canonical bytes"
            );
        }
    }
    // Most single changes still describe some state (a counter, a token); the point is that
    // none of them panics and none is accepted in a second spelling.
    assert!(
        accepted > 0,
        "the mangling reaches values, not only framing"
    );
}

/// Prints the snapshot size of a run with a few thousand model calls next to the token payload
/// those calls carried (what the event batches hold at least).
#[test]
fn snapshot_size_report() {
    let events = run_with_model_calls(3, 6, &sized_executions());
    let mut calls = 0u64;
    let mut tokens = 0u64;
    let mut payload_bytes = 0u64;
    for event in &events {
        if let EventBody::ModelCall(record) = &event.body {
            calls += 1;
            let record_tokens = (record.input_ids.len() + record.output_ids.len()) as u64;
            tokens += record_tokens;
            // Token ids as little-endian u32, log-probs as f32, provenance spans as two u32.
            payload_bytes += 4 * record_tokens
                + 4 * record.output_logprobs.len() as u64
                + 8 * record.input_provenance.len() as u64;
        }
    }
    let state = fold(&events);
    let bytes = state.encode_snapshot();
    let without_trees = {
        let mut lean = state.clone();
        lean.trajectories.trees.clear();
        lean.encode_snapshot().len()
    };
    eprintln!(
        "snapshot size: {} events, {} model calls, {} new tokens; token payload {} bytes; \
         snapshot {} bytes ({:.2} of the payload), of which {} bytes without the trees; \
         {} executions' trees live, {} retired by optimizer steps",
        events.len(),
        calls,
        tokens,
        payload_bytes,
        bytes.len(),
        bytes.len() as f64 / payload_bytes as f64,
        without_trees,
        state.trajectories.trees.len(),
        state.trajectories.retired.len()
    );
    assert!(calls >= 2_000, "a few thousand model calls, got {calls}");
    assert!(
        (bytes.len() as u64) < payload_bytes,
        "varint token ids make the snapshot smaller than the raw token payload"
    );
}

/// A version-5 snapshot was written when the scheduler resolved executions by its own rule: an
/// execution closed by its overall timeout was excluded by scoring at the close but still
/// pending for the scheduler (until an `ExecutionExcluded`). Restored now, the scheduler is
/// handed scoring's resolution, so the group can become ready; it reaches the state a fold
/// does today.
#[test]
fn version_5_snapshots_hand_scoring_resolutions_to_the_scheduler() {
    use gyre_event::CloseStatus;
    let events = simulated_run(5, 2);
    // Fold up to the first close, made an overall timeout, and nothing after it.
    let mut today = ControlState::new();
    let mut closed = None;
    for event in &events {
        let mut event = event.clone();
        if let EventBody::ExecutionClosed { execution, status } = &mut event.body {
            *status = CloseStatus::OverallTimeout;
            closed = Some(*execution);
        }
        today.apply(&event).expect("the run folds");
        if closed.is_some() {
            break;
        }
    }
    let execution = closed.expect("the run closes an execution");
    let held = &today.scheduler.executions[&execution];
    assert_eq!(held.resolution, gyre_scheduler::Resolution::Excluded);
    // What the old scheduler held: pending, its group one resolution short.
    let mut old = today.clone();
    let group = old.scheduler.executions[&execution].group;
    old.scheduler
        .executions
        .get_mut(&execution)
        .expect("held")
        .resolution = gyre_scheduler::Resolution::Pending;
    old.scheduler.groups.get_mut(&group).expect("held").resolved -= 1;
    assert!(old
        .scheduler
        .ready_unpacked
        .iter()
        .all(|(_, g)| *g != group));
    let v5 = as_older_version(&old, 1, 5);
    let restored = ControlState::decode_snapshot(&v5).expect("a version-5 snapshot restores");
    assert_eq!(
        restored.scheduler.executions[&execution].resolution,
        gyre_scheduler::Resolution::Excluded
    );
    assert_eq!(restored, today);
    assert_eq!(restored.digest(), today.digest());
}
