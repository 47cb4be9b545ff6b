//! `gyre trajectory build/admit/pack` as processes: output shapes, properties of the admitted
//! targets, determinism, and clear errors on malformed input.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn gyre(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gyre starts");
    // gyre may reject its arguments and exit before reading stdin; a broken pipe is then expected
    // and the exit status below tells the test what happened.
    if let Err(error) = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
    {
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::BrokenPipe,
            "writing stdin: {error}"
        );
    }
    let output = child.wait_with_output().expect("gyre finishes");
    (
        output.status.success(),
        String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    )
}

fn call(
    execution: &str,
    call: &str,
    agent: &str,
    kind: &str,
    input: &[u32],
    output: &[u32],
) -> String {
    let logprobs: Vec<f64> = output.iter().map(|_| -0.25).collect();
    json!({"execution": execution, "call": call, "agent": agent, "kind": kind, "input_ids": input, "output_ids": output, "output_logprobs": logprobs})
        .to_string()
}

/// Two executions: e1 with a compaction, a sub-agent and a retry; e2 linear.
fn sample() -> String {
    [
        call("e1", "c1", "main", "turn", &[1, 2, 3], &[10, 11]),
        call("e2", "c1", "main", "turn", &[1, 2], &[50]),
        call("e1", "c2", "main", "turn", &[1, 2, 3, 10, 11, 4], &[12, 13]),
        call("e1", "c3", "explorer", "turn", &[7, 8], &[40, 41]),
        call("e1", "c4", "explorer", "turn", &[7, 8, 40, 41, 9], &[42]),
        call(
            "e1",
            "c5",
            "explorer",
            "turn",
            &[7, 8, 40, 41, 9],
            &[43, 44],
        ),
        call(
            "e1",
            "c6",
            "main",
            "summary",
            &[1, 2, 3, 10, 11, 4, 12, 13, 5],
            &[20, 21, 22],
        ),
        call("e1", "c7", "main", "turn", &[1, 2, 9, 20, 21, 22], &[30]),
        call("e2", "c2", "main", "turn", &[1, 2, 50, 3], &[51, 52]),
    ]
    .join("\n")
}

fn lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("each output line is JSON"))
        .collect()
}

#[test]
fn build_prints_tree_and_statistics() {
    let (ok, stdout, stderr) = gyre(&["trajectory", "build"], &sample());
    assert!(ok, "{stderr}");
    assert!(stdout.contains("execution e1"), "{stdout}");
    assert!(
        stdout.contains("c3 explorer/turn @0 +in 2 +out 2 spawned-by:c2"),
        "{stdout}"
    );
    assert!(stdout.contains("node occurrences:"), "{stdout}");
    let (ok, stdout, stderr) = gyre(&["trajectory", "build", "--json"], &sample());
    assert!(ok, "{stderr}");
    let executions = lines(&stdout);
    assert_eq!(executions[0]["execution"], "e1");
    assert_eq!(executions[0]["requests"], 7);
    assert_eq!(executions[0]["roots"], 2);
    assert_eq!(
        executions[0]["candidates_per_class"],
        json!({"main": 1, "main-summary": 1, "sub-agent": 2, "sub-agent-summary": 0})
    );
}

#[test]
fn admit_output_has_the_documented_shape_and_properties() {
    let (ok, stdout, stderr) = gyre(
        &["trajectory", "admit", "--jmax", "3", "--seed", "11"],
        &sample(),
    );
    assert!(ok, "{stderr}");
    let executions = lines(&stdout);
    assert_eq!(executions.len(), 2);
    let e1 = &executions[0];
    assert_eq!(e1["execution"], "e1");
    assert_eq!(e1["candidates"], 4);
    let trajectories = e1["trajectories"].as_array().expect("trajectories array");
    assert_eq!(trajectories.len(), 3, "J ≤ J_max and enough candidates");
    assert_eq!(trajectories[0]["class"], "main");
    assert_eq!(trajectories[1]["class"], "main-summary");
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for trajectory in trajectories {
        let mut count = 0;
        for target in trajectory["targets"].as_array().expect("targets") {
            let (call, start, end) = (
                target[0].as_str().expect("call"),
                target[1].as_u64().expect("start"),
                target[2].as_u64().expect("end"),
            );
            assert!(start < end);
            for index in start..end {
                assert!(
                    seen.insert((call.to_string(), index)),
                    "targets are disjoint"
                );
            }
            count += end - start;
        }
        assert_eq!(trajectory["target_count"], count);
        total += count;
    }
    assert_eq!(e1["L_i"], total);
    // The main leaf c7 branches from the system prompt: only its own output is a target.
    assert_eq!(trajectories[0]["targets"], json!([["c7", 0, 1]]));
    let (_, again, _) = gyre(
        &["trajectory", "admit", "--jmax", "3", "--seed", "11"],
        &sample(),
    );
    assert_eq!(again, stdout, "same seed, same admission");
}

#[test]
fn pack_emits_micro_steps_with_weights() {
    let mut input = sample();
    input.push('\n');
    input.push_str(
        &[
            json!({"execution": "e1", "reward": 1.0}).to_string(),
            json!({"execution": "e2", "reward": 0.0}).to_string(),
        ]
        .join("\n"),
    );
    let (ok, stdout, stderr) = gyre(
        &[
            "trajectory",
            "pack",
            "--b",
            "1",
            "--n",
            "2",
            "--tokens-max",
            "32",
        ],
        &input,
    );
    assert!(ok, "{stderr}");
    let packed: Value = serde_json::from_str(stdout.trim()).expect("pack prints one JSON object");
    assert_eq!(packed["stream_closed"], true);
    let micro_steps = packed["micro_steps"].as_array().expect("micro-steps");
    assert!(!micro_steps.is_empty());
    let mut weight_per_execution = std::collections::BTreeMap::new();
    for micro_step in micro_steps {
        let lengths: u64 = micro_step["lengths"]
            .as_array()
            .expect("lengths")
            .iter()
            .map(|length| length.as_u64().expect("length"))
            .sum();
        assert!(lengths <= 32 && lengths == micro_step["tokens"].as_u64().expect("tokens"));
        for row in micro_step["rows"].as_array().expect("rows") {
            let weight = row["weight"].as_f64().expect("weight")
                * row["target_count"].as_f64().expect("count");
            *weight_per_execution
                .entry(row["execution"].as_str().expect("name").to_string())
                .or_insert(0.0) += weight;
        }
    }
    for (execution, weight) in weight_per_execution {
        // Σ targets · 1/(L_i·B·N) = 1/(B·N) = 1/2 per execution.
        assert!((weight - 0.5).abs() < 1e-12, "{execution}: {weight}");
    }
    assert!(
        packed["padding_fraction"].as_f64().expect("fraction")
            <= packed["naive_padding_fraction"].as_f64().expect("naive")
    );
}

fn rejects(input: &str, fragments: &[&str]) {
    let (ok, _, stderr) = gyre(&["trajectory", "admit"], input);
    assert!(!ok, "accepted: {input}");
    for fragment in fragments {
        assert!(
            stderr.contains(fragment),
            "stderr {stderr:?} lacks {fragment:?}"
        );
    }
}

#[test]
fn malformed_lines_are_rejected_with_line_and_field() {
    let good = call("e1", "c1", "main", "turn", &[1, 2], &[3]);
    rejects(
        &format!(
            "{good}\n{}",
            json!({"execution": "e1", "call": "c2", "agent": "main", "input_ids": [1], "output_ids": [4, 5], "output_logprobs": [-0.1]})
        ),
        &["line 2", "output_logprobs", "lengths must match"],
    );
    rejects(
        &call("e1", "c1", "main", "turn", &[], &[3]),
        &["line 1", "input_ids", "empty ids"],
    );
    rejects(
        &call("e1", "c1", "main", "turn", &[1], &[]),
        &["line 1", "output_ids", "empty ids"],
    );
    rejects(
        &call("", "c1", "main", "turn", &[1], &[2]),
        &["line 1", "execution", "empty id"],
    );
    rejects(
        &format!("{good}\n{}", call("e1", "c1", "main", "turn", &[1], &[2])),
        &["line 2", "call", "twice"],
    );
    rejects(
        &format!(
            "{}\n{}",
            call("e1", "c5", "main", "turn", &[1], &[2]),
            call("e1", "c3", "main", "turn", &[1], &[2])
        ),
        &["line 2", "call", "non-monotone"],
    );
    rejects(
        &call("e1", "c1", "main", "compact", &[1], &[2]),
        &["line 1", "kind", "unknown kind"],
    );
    rejects(&format!("{good}\nnot json"), &["line 2", "invalid JSON"]);
    rejects(
        &json!({"execution": "e1", "call": "c1", "agent": "main", "input_ids": [1, -4], "output_ids": [2], "output_logprobs": [-0.1]}).to_string(),
        &["line 1", "input_ids", "element 1"],
    );
    rejects(
        &json!({"execution": "e1", "call": "c1", "agent": "main", "input_ids": [1], "output_ids": [2], "output_logprobs": [0.5]}).to_string(),
        &["line 1", "output_logprobs", "log-prob"],
    );
    rejects(&json!({"execution": "e1", "call": "c1", "input_ids": [1], "output_ids": [2], "output_logprobs": [-0.1]}).to_string(), &["line 1", "agent", "missing"]);
}

#[test]
fn custom_role_classes_from_toml() {
    let dir = std::env::temp_dir().join(format!("gyre-classes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("classes.toml");
    std::fs::write(&path, "[[class]]\nname = \"helpers\"\nagent_except = \"main\"\n\n[[class]]\nname = \"lead\"\nagent = \"main\"\n")
        .expect("write classes");
    let (ok, stdout, stderr) = gyre(
        &[
            "trajectory",
            "admit",
            "--jmax",
            "1",
            "--classes",
            path.to_str().expect("utf-8 path"),
        ],
        &sample(),
    );
    assert!(ok, "{stderr}");
    assert_eq!(lines(&stdout)[0]["trajectories"][0]["class"], "helpers");
    std::fs::write(&path, "[[class]]\nname = \"x\"\nkind = \"other\"\n").expect("write classes");
    let (ok, _, stderr) = gyre(
        &[
            "trajectory",
            "admit",
            "--classes",
            path.to_str().expect("utf-8 path"),
        ],
        &sample(),
    );
    assert!(!ok && stderr.contains("class[0].kind"), "{stderr}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Groups are ordered by their first line, named and unnamed alike, and a line without a
/// `policy_version` counts as version 0 (docs/trajectory.md): an unnamed group holding a
/// version-0 line goes before a named version-2 group that appears later.
#[test]
fn pack_orders_groups_by_version_then_input_order() {
    let mut input = vec![
        call("e1", "c1", "main", "turn", &[1, 2, 3], &[10, 11]),
        call("e2", "c1", "main", "turn", &[1, 2], &[50]),
        call("e3", "c1", "main", "turn", &[1, 4], &[60]),
        call("e4", "c1", "main", "turn", &[1, 5], &[70]),
    ];
    input.extend(
        [
            json!({"execution": "e1", "reward": 1.0}),
            json!({"execution": "e2", "reward": 0.0, "policy_version": 3}),
            json!({"execution": "e3", "reward": 1.0, "group": "g", "policy_version": 2}),
            json!({"execution": "e4", "reward": 0.0, "group": "g", "policy_version": 2}),
        ]
        .iter()
        .map(Value::to_string),
    );
    let (ok, stdout, stderr) = gyre(
        &[
            "trajectory",
            "pack",
            "--b",
            "1",
            "--n",
            "2",
            "--tokens-max",
            "32",
        ],
        &input.join("\n"),
    );
    assert!(ok, "{stderr}");
    let packed: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let groups = packed["groups"].as_array().expect("groups");
    assert_eq!(groups[0]["group"], "group-0", "{packed}");
    assert_eq!(groups[0]["policy_version"], 0, "{packed}");
}
