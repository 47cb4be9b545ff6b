//! Shared test helpers: paths to the crate's test data, the test model, and a record sink
//! that keeps nothing.

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

/// A sink that accepts every record and keeps none (for requests whose records a test does
/// not read, or that are refused before anything is recorded).
pub struct NoSink;

impl gyre_proxy::server::RecordSink for NoSink {
    fn commit(
        &self,
        _events: Vec<gyre_event::Event>,
    ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
    {
        Box::pin(async { Ok(()) })
    }

    fn describe(&self) -> String {
        "nowhere".into()
    }
}
