//! Theorem A.1 on configurations the presets do not contain: the steady-state group-weighted mean
//! staleness of a 48-step run is φ + (μ − 1)/2 within ±0.1, for elastic, async and colocate.

use gyre_simulator::{preset_rows, simulate, Preset, PresetOverrides, SimConfig};
use proptest::prelude::*;

/// A small cluster so that a 48-step run takes milliseconds: the E0 row with B = 8, N = 4.
fn small(mode: &str, phi_groups: u32, mu: u32, seed: u64) -> SimConfig {
    let rows = preset_rows(
        Preset::Table2,
        seed,
        PresetOverrides {
            n: Some(4),
            b: Some(8),
            training_work_ratio: None,
        },
    );
    let id = match mode {
        "async" => "A0",
        "colocate" => "C0",
        _ => "E0",
    };
    let mut config = rows
        .into_iter()
        .find(|row| row.id == id)
        .expect("table2 has the row")
        .config;
    config.steps = 48;
    config.mu = mu;
    config.phi = if mode == "colocate" {
        0.0
    } else {
        phi_groups as f64 / config.b as f64
    };
    config.validate().expect("the generated config is valid");
    config
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn steady_state_staleness_matches_theorem_a1(
        mode in prop::sample::select(vec!["elastic", "async", "colocate"]),
        phi_groups in 0u32..=20,
        mu in 1u32..=4,
        seed in 0u64..1000,
    ) {
        let config = small(mode, phi_groups, mu, seed);
        let report = simulate(&config).report;
        let expected = config.phi + (mu as f64 - 1.0) / 2.0;
        prop_assert!(
            (report.steady_state_mean_staleness - expected).abs() <= 0.1,
            "{mode} φ={} μ={mu} seed={seed}: steady-state mean staleness {} vs φ + (μ−1)/2 = {expected}",
            config.phi, report.steady_state_mean_staleness
        );
        prop_assert_eq!(report.groups_consumed, 48 * config.b as u64);
    }
}

#[test]
fn same_seed_gives_byte_identical_json() {
    let config = small("elastic", 4, 3, 11);
    let first = serde_json::to_string(&simulate(&config).report).expect("report serialises");
    let second = serde_json::to_string(&simulate(&config).report).expect("report serialises");
    assert_eq!(first, second);
    let mut other = config.clone();
    other.seed = 12;
    let third = serde_json::to_string(&simulate(&other).report).expect("report serialises");
    assert_ne!(first, third, "a different seed should change the run");
}

/// The groups a run dispatches: (φ+μ)·B at the start, then after each publish μ·B, or B per
/// step still to train when fewer than μ remain, and none once the run is complete (a rollout
/// dispatched then would never be trained on). The short last burst must still train: with or
/// without streaming, elastic, async and colocate (φ = 0, where the burst's data is all there
/// is). 10 steps at μ = 4: 4 + 4 + 2.
#[test]
fn a_run_dispatches_no_more_than_its_steps_consume() {
    for mode in ["elastic", "async", "colocate"] {
        for streaming in [true, false] {
            for (steps, mu, phi_groups) in [
                (10u32, 4u32, 4u32),
                (8, 4, 4),
                (5, 4, 0),
                (4, 3, 4),
                (5, 1, 0),
            ] {
                let mut config = small(mode, phi_groups, mu, 3);
                config.steps = steps;
                config.streaming = streaming;
                let b = config.b as u64;
                let phi_groups = (config.phi * config.b as f64).round() as u64;
                let case =
                    format!("{mode} streaming={streaming} steps={steps} μ={mu} φ·B={phi_groups}");
                let run = gyre_simulator::try_simulate(&config)
                    .unwrap_or_else(|error| panic!("{case}: {error}"));
                let mut dispatched = 0u64;
                let mut trained = 0u32;
                for event in run.events.iter() {
                    match &event.body {
                        gyre_event::EventBody::GroupsDispatched { groups, .. } => {
                            assert!(trained < steps, "{case}: dispatched after the last step");
                            dispatched += groups.len() as u64;
                        }
                        gyre_event::EventBody::OptimizerStepped { .. } => trained += 1,
                        _ => {}
                    }
                }
                assert_eq!(trained, steps, "{case}");
                assert_eq!(
                    dispatched,
                    phi_groups + steps as u64 * b,
                    "{case}: the buffer φ·B plus B per step"
                );
            }
        }
    }
}
