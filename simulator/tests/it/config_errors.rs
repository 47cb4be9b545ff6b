//! Bad configs are rejected with an error that names the field.

use gyre_simulator::{preset_rows, Preset, PresetOverrides, SimConfig};

fn e0_toml() -> String {
    let rows = preset_rows(Preset::Table2, 1, PresetOverrides::default());
    rows.into_iter()
        .find(|row| row.id == "E0")
        .expect("table2 has an E0 row")
        .config
        .to_toml()
}

fn replace_line(toml: &str, key: &str, value: &str) -> String {
    let mut replaced = false;
    let out: Vec<String> = toml
        .lines()
        .map(|line| {
            if !replaced && line.starts_with(&format!("{key} = ")) {
                replaced = true;
                format!("{key} = {value}")
            } else {
                line.to_string()
            }
        })
        .collect();
    assert!(replaced, "the E0 config has a `{key}` line");
    out.join("\n")
}

fn error_of(toml: &str) -> String {
    match SimConfig::from_toml(toml) {
        Ok(_) => panic!("config should have been rejected:\n{toml}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn printed_preset_config_round_trips() {
    let toml = e0_toml();
    let config = SimConfig::from_toml(&toml).expect("a printed preset is a valid config");
    assert_eq!(config.to_toml(), toml);
}

#[test]
fn each_bad_field_is_named() {
    let base = e0_toml();
    let cases: Vec<(String, &str)> = vec![
        (replace_line(&base, "mu", "0"), "`mu`"),
        (replace_line(&base, "phi", "-0.5"), "`phi`"),
        (replace_line(&base, "phi", "0.51"), "`phi`"),
        (
            replace_line(&replace_line(&base, "mode", "\"colocate\""), "phi", "0.5"),
            "`phi`",
        ),
        (replace_line(&base, "rho_min", "1.5"), "`rho_min`"),
        (
            replace_line(&base, "nodes_per_cell", "2"),
            "`cells.nodes_per_cell`",
        ),
        (replace_line(&base, "b", "0"), "`b`"),
        (replace_line(&base, "steps", "0"), "`steps`"),
        (
            replace_line(&base, "async_training_cells", "3"),
            "`async_training_cells`",
        ),
        (
            replace_line(&base, "harness_timeout_h", "9.0"),
            "`workload.overall_timeout_h`",
        ),
        (replace_line(&base, "mode", "\"hybrid\""), "mode"),
        (format!("{base}\nphi_extra = 1"), "phi_extra"),
        (replace_line(&base, "mu", "\"three\""), "mu"),
        // Values that once overflowed simulated time or a node count, panicked or gave
        // silently wrong hours (a review's reproductions).
        (replace_line(&base, "tau_s", "1e10"), "`tau_s`"),
        (
            replace_line(&base, "optimizer_s", "1e300"),
            "`training.optimizer_s`",
        ),
        (
            replace_line(&base, "node_hours_per_step", "1e300"),
            "`training.node_hours_per_step`",
        ),
        (
            replace_line(&base, "nodes_per_cell", "4000000000"),
            "`cells.nodes_per_cell`",
        ),
        (
            replace_line(&base, "query_sigma", "1000.0"),
            "`workload.query_sigma`",
        ),
        (replace_line(&base, "mu", "50"), "`mu`"),
        (replace_line(&base, "n", "5000000"), "`n`"),
    ];
    for (toml, field) in cases {
        let error = error_of(&toml);
        assert!(
            error.contains(field),
            "error `{error}` does not name {field}"
        );
    }
}
