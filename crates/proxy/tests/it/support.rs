//! Shared test helpers: paths to the crate's test data and the test model.

use std::path::PathBuf;

use gyre_proxy::template::CivilDateTime;
use gyre_proxy::{ChatModel, ToolArgumentsForm};

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn testdata(relative: &str) -> PathBuf {
    crate_dir().join("testdata").join(relative)
}

pub fn read_testdata(relative: &str) -> String {
    std::fs::read_to_string(testdata(relative))
        .unwrap_or_else(|error| panic!("reading testdata/{relative}: {error}"))
}

pub fn test_model_dir() -> PathBuf {
    crate_dir().join("assets/test-model")
}

pub fn test_model() -> ChatModel {
    ChatModel::load(&test_model_dir(), ToolArgumentsForm::RawText).expect("the test model loads")
}

/// The date `jinja2_reference.py` renders `strftime_now` with.
pub fn reference_now() -> CivilDateTime {
    CivilDateTime {
        year: 2026,
        month: 12,
        day: 2,
        hour: 9,
        minute: 5,
        second: 7,
    }
}
