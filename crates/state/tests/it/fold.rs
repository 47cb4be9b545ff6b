//! Folding a simulated run: every event applies, the digest is a pure function of the events, and
//! any change to the events changes it.

use gyre_simulator::{preset_rows, simulate, Preset, PresetOverrides};
use gyre_state::ControlState;

fn small_run() -> Vec<gyre_event::Event> {
    simulated_run(3, 6)
}

/// The events of a small simulated Table 2 E0 run (N = 4, B = 8).
pub(crate) fn simulated_run(seed: u64, steps: u32) -> Vec<gyre_event::Event> {
    let mut config = preset_rows(
        Preset::Table2,
        seed,
        PresetOverrides {
            n: Some(4),
            b: Some(8),
            training_work_ratio: None,
        },
    )
    .into_iter()
    .find(|row| row.id == "E0")
    .expect("table2 has E0")
    .config;
    config.steps = steps;
    simulate(&config).events
}

fn fold(events: &[gyre_event::Event]) -> ControlState {
    let mut state = ControlState::new();
    for event in events {
        state.apply(event).expect("every simulated event applies");
        state.validate().expect("state stays valid");
    }
    state
}

#[test]
fn folding_is_deterministic_and_sensitive() {
    let events = small_run();
    assert!(events.len() > 500, "only {} events", events.len());
    let first = fold(&events);
    let second = fold(&events);
    assert_eq!(first.digest(), second.digest());
    assert_eq!(first.events_applied, events.len() as u64);
    let shorter = fold(&events[..events.len() - 1]);
    assert_ne!(
        first.digest(),
        shorter.digest(),
        "dropping the last event must change the digest"
    );
}

#[test]
fn a_refused_event_names_its_projection() {
    let events = small_run();
    let mut state = ControlState::new();
    let error = state
        .apply(&events[1])
        .expect_err("a cell registered before the run started is refused");
    assert!(
        error.to_string().starts_with("scheduler projection:"),
        "{error}"
    );
}
