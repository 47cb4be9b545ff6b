//! Byte-for-byte agreement with Python jinja2 as HF transformers configures it.
//!
//! `testdata/template_cases.json` holds templates and contexts; `testdata/template_expected.json`
//! holds what `testdata/jinja2_reference.py` (real jinja2 3.1.6, transformers' environment)
//! rendered for them. Every case must render to exactly those bytes here, or fail with the same
//! `raise_exception` message. `GYRE_PROXY_TEMPLATE_CASES=<dir>` runs a second case set kept
//! outside the repository (real model templates), prepared with `jinja2_reference.py --dir`.

use std::path::Path;

use gyre_proxy::{ChatTemplate, SpecialTokens, ToolArgumentsForm};
use serde_json::Value;

use crate::support::{reference_now, testdata};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn render_case(directory: &Path, case: &Value) -> Result<String, String> {
    let source = match case.get("template_file").and_then(Value::as_str) {
        Some(file) => read(&directory.join(file)),
        None => case["template"]
            .as_str()
            .expect("a case has a template or a template_file")
            .to_string(),
    };
    let template = ChatTemplate::new(
        &source,
        SpecialTokens::default(),
        ToolArgumentsForm::RawText,
    )
    .map_err(|error| format!("compile: {error}"))?;
    let context = case["context"]
        .as_object()
        .expect("a case's context is an object")
        .clone();
    template
        .render_context(context, reference_now())
        .map_err(|error| error.to_string())
}

/// The differing cases, described.
fn differences(directory: &Path) -> (usize, Vec<String>) {
    let cases: Vec<Value> =
        serde_json::from_str(&read(&directory.join("template_cases.json"))).expect("cases parse");
    let expected: serde_json::Map<String, Value> =
        serde_json::from_str(&read(&directory.join("template_expected.json")))
            .expect("expected parses");
    assert_eq!(cases.len(), expected.len(), "re-run jinja2_reference.py");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().expect("a case has a name");
        let want = &expected[name];
        let got = render_case(directory, case);
        let matches = match (&got, want.get("output"), want.get("error")) {
            (Ok(output), Some(Value::String(wanted)), _) => output == wanted,
            (Err(message), _, Some(Value::String(wanted))) => {
                message == &format!("chat template: {wanted}")
            }
            _ => false,
        };
        if !matches {
            failures.push(format!("{name}:\n  jinja2: {want}\n  ours:   {got:?}"));
        }
    }
    (cases.len(), failures)
}

fn assert_no_differences(directory: &Path) {
    let (count, failures) = differences(directory);
    assert!(
        failures.is_empty(),
        "{} of {count} cases differ from jinja2:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_case_matches_python_jinja2() {
    assert_no_differences(&testdata(""));
}

#[test]
fn external_cases_match_python_jinja2_when_given() {
    if let Some(directory) = std::env::var_os("GYRE_PROXY_TEMPLATE_CASES") {
        assert_no_differences(Path::new(&directory));
    }
}

#[test]
fn a_wrong_expectation_is_reported() {
    // The comparison can fail: a copy of the cases with one expected byte changed differs.
    let directory = tempfile::tempdir().expect("temp dir");
    let cases = std::fs::read_to_string(testdata("template_cases.json")).expect("cases");
    let cases: Vec<Value> = serde_json::from_str(&cases).expect("cases parse");
    let inline: Vec<&Value> = cases
        .iter()
        .filter(|case| case.get("template").is_some())
        .collect();
    std::fs::write(
        directory.path().join("template_cases.json"),
        serde_json::to_string(&inline).expect("serialises"),
    )
    .expect("write");
    let mut expected: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(testdata("template_expected.json")).expect("expected"),
    )
    .expect("expected parses");
    expected.retain(|name, _| inline.iter().any(|case| case["name"] == name.as_str()));
    expected["print_scalars"]["output"] =
        Value::from("None|true|False|1|2.5|2.0|3|1|3.0|7||12345678901234567890");
    std::fs::write(
        directory.path().join("template_expected.json"),
        serde_json::to_string(&expected).expect("serialises"),
    )
    .expect("write");
    let (_, failures) = differences(directory.path());
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].starts_with("print_scalars"));
}
