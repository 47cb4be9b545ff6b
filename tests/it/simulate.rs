//! `gyre simulate` and `gyre quickstart` as processes: byte-identical output for a seed, the JSON
//! schema, config round trips, clear errors on bad configs, the HTML report, and the event log
//! replaying to the run's final projection digest.

use crate::support::gyre;

use gyre_event::EventBody;
use gyre_state::ControlState;
use serde_json::Value;

fn e0_config(dir: &std::path::Path) -> std::path::PathBuf {
    let (code, toml, stderr) = gyre(&[
        "simulate",
        "--preset",
        "table2",
        "--row",
        "E0",
        "--print-config",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let path = dir.join("e0.toml");
    std::fs::write(&path, toml).expect("write config");
    path
}

#[test]
fn same_seed_same_bytes_and_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = e0_config(dir.path());
    let config = config.to_str().expect("utf-8 path");
    let (code, first, stderr) = gyre(&["simulate", "--config", config, "--seed", "4", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let (_, second, _) = gyre(&["simulate", "--config", config, "--seed", "4", "--json"]);
    assert_eq!(first, second, "same seed must give byte-identical JSON");
    let report: Value = serde_json::from_str(&first).expect("JSON report");
    for field in [
        "total_hours",
        "step_end_hours",
        "mean_staleness",
        "staleness_by_step",
        "staleness_histogram",
        "executions",
        "groups_consumed",
        "utilization",
        "cells",
    ] {
        assert!(report.get(field).is_some(), "report lacks `{field}`");
    }
    assert_eq!(report["step_end_hours"].as_array().map(Vec::len), Some(12));
    assert_eq!(
        report["staleness_by_step"].as_array().map(Vec::len),
        Some(12)
    );
    assert_eq!(report["groups_consumed"], 12 * 32);
    let executions = &report["executions"];
    assert!(executions["dispatched"].as_u64() >= executions["started"].as_u64());
    assert!(executions["started"].as_u64() >= executions["finished"].as_u64());
    let cells = report["cells"].as_array().expect("cells array");
    assert_eq!(cells.len(), 8);
    for cell in cells {
        let intervals = cell["intervals"].as_array().expect("intervals");
        assert!(!intervals.is_empty());
        for interval in intervals {
            let role = interval["role"].as_str().expect("role");
            assert!(["rollout", "training", "switching"].contains(&role));
            assert!(interval["start_h"].as_f64() <= interval["end_h"].as_f64());
        }
    }
    let utilization = &report["utilization"];
    for key in ["rollout", "training"] {
        let value = utilization[key].as_f64().expect("utilization value");
        assert!((0.0..=1.0).contains(&value), "{key} utilisation {value}");
    }
}

#[test]
fn preset_table_matches_its_json_and_is_deterministic() {
    let (code, first, stderr) =
        gyre(&["simulate", "--preset", "table2", "--json", "--threads", "2"]);
    assert_eq!(code, 0, "{stderr}");
    let (_, second, _) = gyre(&["simulate", "--preset", "table2", "--json", "--threads", "1"]);
    assert_eq!(first, second, "thread count must not change the output");
    let table: Value = serde_json::from_str(&first).expect("JSON table");
    let rows = table["rows"].as_array().expect("rows");
    let ids: Vec<&str> = rows.iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(
        ids,
        ["A0", "A1", "A2", "A3", "C0", "C1", "C2", "C3", "E0", "E1", "E2"]
    );
    assert_eq!(table["reports"].as_array().map(Vec::len), Some(11));
}

#[test]
fn bad_configs_fail_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read_to_string(e0_config(dir.path())).expect("read config");
    let cases = [
        (good.replace("mu = 3", "mu = 0"), "`mu`"),
        (good.replace("phi = 0.5", "phi = -1.0"), "`phi`"),
        (
            good.replace("mode = \"elastic\"", "mode = \"colocate\""),
            "`phi`",
        ),
        (
            good.replace("\nnodes_per_cell = 4", "\nnodes_per_cell = 1"),
            "cells.nodes_per_cell",
        ),
        (format!("{good}\nsurprise = true\n"), "surprise"),
    ];
    for (index, (text, field)) in cases.iter().enumerate() {
        assert_ne!(text, &good, "case {index} changed nothing");
        let path = dir.path().join(format!("bad{index}.toml"));
        std::fs::write(&path, text).expect("write bad config");
        let (code, _, stderr) = gyre(&["simulate", "--config", path.to_str().expect("utf-8")]);
        assert_eq!(code, 2, "case {index} should fail");
        assert!(
            stderr.contains(field),
            "case {index}: `{stderr}` does not name {field}"
        );
    }
    let (code, _, stderr) = gyre(&["simulate", "--preset", "table9"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("table9"));
}

#[test]
fn report_and_event_log_replay_to_the_final_digest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = e0_config(dir.path());
    let html = dir.path().join("e0.html");
    let log = dir.path().join("e0.log");
    let (code, stdout, stderr) = gyre(&[
        "simulate",
        "--config",
        config.to_str().expect("utf-8"),
        "--json",
        "--report",
        html.to_str().expect("utf-8"),
        "--log",
        log.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("JSON report");
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(page.contains("<svg") && page.contains("cell role timeline"));

    // Replay: fold every entry into a fresh projection, checking each digest checkpoint.
    let entries = gyre_log::EventFileReader::read_all_events(&log).expect("log reads back");
    let mut state = ControlState::new();
    let mut checkpoints = 0;
    for (_, events) in &entries {
        for event in events {
            if let EventBody::ProjectionDigest { hash, .. } = &event.body {
                assert_eq!(&state.digest(), hash, "digest checkpoint differs on replay");
                checkpoints += 1;
            }
            state.apply(event).expect("every logged event applies");
            state.validate().expect("state stays valid on replay");
        }
    }
    assert!(checkpoints > 10, "only {checkpoints} digest checkpoints");
    let digest: String = state.digest().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(report["final_digest"].as_str(), Some(digest.as_str()));
}

/// `--print-config` shows only a config `--config` accepts; an override that makes the row
/// invalid is refused naming the flag the user gave, not only the field derived from it.
#[test]
fn print_config_refuses_an_invalid_row_naming_the_flag() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--b", "0", "--print-config"], &["--b 0", "`b`"]),
        (&["--n", "0"], &["--n 0", "`n`"]),
        (
            &["--training-work-ratio", "1e300", "--print-config"],
            &["--training-work-ratio 1e300"],
        ),
        (
            &["--training-work-ratio", "-1", "--print-config"],
            &["--training-work-ratio"],
        ),
    ];
    for (extra, named) in cases {
        let mut args = vec!["simulate", "--preset", "table2", "--row", "E0"];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = gyre(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?} printed a config: {stdout}");
        for name in *named {
            assert!(stderr.contains(name), "{args:?} names {name}: {stderr}");
        }
    }
}

#[test]
fn quickstart_writes_report_and_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("qs");
    let (code, stdout, stderr) = gyre(&["quickstart", "--out", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("E0") && stdout.contains("report:"));
    assert!(out.join("table2.html").is_file());
    assert!(out.join("e0.log").is_file());
    // The table once (E0 is not simulated and printed again for its log), then where things
    // went: the log's head before the next step.
    let e0_rows = stdout
        .lines()
        .filter(|line| line.starts_with("E0 "))
        .count();
    assert_eq!(e0_rows, 1, "{stdout}");
    let position = |text: &str| {
        stdout
            .find(text)
            .unwrap_or_else(|| panic!("`{text}` in {stdout}"))
    };
    assert!(position("order by total hours") < position("report:"));
    assert!(position("report:") < position("event log:"));
    assert!(position("event log:") < position("head ") && position("head ") < position("next:"));

    // The log is the E0 run the table shows: it replays to that run's final digest.
    let (code, json, stderr) = gyre(&["simulate", "--preset", "table2", "--row", "E0", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let table: Value = serde_json::from_str(&json).expect("JSON table");
    let entries =
        gyre_log::EventFileReader::read_all_events(out.join("e0.log")).expect("log reads back");
    let mut state = ControlState::new();
    for (_, events) in &entries {
        for event in events {
            state.apply(event).expect("every logged event applies");
        }
    }
    let digest: String = state.digest().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        table["reports"][0]["final_digest"].as_str(),
        Some(digest.as_str())
    );
}

/// `gyre simulate --json | head -c 10`: the reader goes away after a few bytes; the command ends
/// quietly with status 0, as Unix tools do, instead of panicking on the broken pipe.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let (code, stderr) =
        crate::closed_stdout::into_closed_pipe(&["simulate", "--preset", "table2", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
