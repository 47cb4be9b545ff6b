//! Upcasting: old bodies decode into today's types.

use gyre_event::{Duration, EventBody, RunConfig, SchedulingMode, Timestamp};
use gyre_log::codec::upcast::{upcaster, RUN_STARTED_V1_J_MAX, UPCASTERS};
use gyre_log::codec::{
    current_schema_version, decode_batch, encode_envelope, BodyError, CodecError, EventKind,
    ALL_KINDS, OLDEST_SCHEMA_VERSION,
};
use gyre_proto::events as pb;
use prost::Message;

pub fn run_started_v1_message() -> pb::RunStartedV1 {
    pb::RunStartedV1 {
        run_seed: 7,
        mode: pb::SchedulingMode::Colocate as i32,
        streaming: false,
        phi: 0.0,
        mu: 1,
        n: 8,
        b: 16,
        steps: 10,
        rho_min: 0.5,
        tau_seconds: 2.25,
        async_training_cells: 0,
    }
}

/// What `run_started_v1_message` means today.
pub fn run_started_v1_expected() -> RunConfig {
    RunConfig {
        run_seed: 7,
        mode: SchedulingMode::Colocate,
        streaming: false,
        phi: 0.0,
        mu: 1,
        n: 8,
        b: 16,
        steps: 10,
        rho_min: 0.5,
        tau: Duration(2_250_000_000),
        j_max: 5,
        async_training_cells: 0,
    }
}

pub fn v1_record(message: &pb::RunStartedV1, at_nanos: u64) -> pb::EventRecord {
    pb::EventRecord {
        kind: EventKind::RunStarted as u32,
        schema_version: 1,
        at_nanos,
        body: message.encode_to_vec().into(),
    }
}

#[test]
fn run_started_v1_upcasts_to_the_current_config() {
    let bytes = encode_envelope(vec![v1_record(&run_started_v1_message(), 11)]);
    let events = decode_batch(&bytes).expect("v1 decodes");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].at, Timestamp(11));
    assert_eq!(
        events[0].body,
        EventBody::RunStarted(run_started_v1_expected())
    );
    assert_eq!(RUN_STARTED_V1_J_MAX, 5);
}

#[test]
fn without_the_version_protobuf_alone_would_misread_v1() {
    // The reason the envelope carries a schema version: v1 bytes parse as a v2 message without
    // complaint, but τ reads as zero and j_max as zero.
    let misread = pb::RunStarted::decode(&*run_started_v1_message().encode_to_vec())
        .expect("protobuf accepts it");
    assert_eq!(misread.tau_nanos, 0);
    assert_eq!(misread.j_max, 0);
}

#[test]
fn a_v1_body_with_a_nonsense_tau_is_refused_naming_the_field() {
    let mut message = run_started_v1_message();
    message.tau_seconds = f64::NAN;
    let error = decode_batch(&encode_envelope(vec![v1_record(&message, 0)])).expect_err("nan");
    assert!(
        matches!(
            &error,
            CodecError::Body {
                kind: "run_started",
                schema_version: 1,
                problem: BodyError::InvalidValue {
                    field: "run_started_v1.tau_seconds",
                    ..
                },
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn a_v1_body_with_a_bad_mode_is_refused_after_upcasting() {
    let mut message = run_started_v1_message();
    message.mode = 9;
    let error = decode_batch(&encode_envelope(vec![v1_record(&message, 0)])).expect_err("mode");
    assert_eq!(
        error.to_string(),
        "event 0 (run_started v1): `run_started.mode` has invalid enum value 9"
    );
}

#[test]
fn every_old_version_of_every_kind_has_an_upcaster() {
    for kind in ALL_KINDS {
        for version in OLDEST_SCHEMA_VERSION..current_schema_version(kind) {
            assert!(
                upcaster(kind, version).is_some(),
                "{kind:?} v{version} has no upcaster to v{}",
                version + 1
            );
        }
    }
    for step in UPCASTERS {
        assert!(
            step.from_version < current_schema_version(step.kind),
            "{:?}: upcaster from v{} goes beyond the current version",
            step.kind,
            step.from_version
        );
        assert!(!step.change.is_empty());
    }
}

/// The leader keeps a client's current-version bodies as sent and upcasts older ones, so what it
/// commits always decodes to what the client meant, at the schema version this build writes.
#[test]
fn validated_records_keep_current_bodies_and_upcast_old_ones() {
    use gyre_event::Event;
    let current = Event::new(Timestamp(5), EventBody::Tick);
    let current_record = gyre_log::encode_record(&current);
    let old = v1_record(&run_started_v1_message(), 11);
    let bytes = bytes::Bytes::from(encode_envelope(vec![current_record.clone(), old.clone()]));
    let records = gyre_log::validated_records(&bytes).expect("both decode");
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0], current_record,
        "a current record is kept as it came"
    );
    assert_eq!(
        records[1].schema_version,
        current_schema_version(EventKind::RunStarted)
    );
    assert_ne!(records[1].body, old.body, "the v1 body was upcast");
    let decoded = decode_batch(&encode_envelope(records)).expect("decodes");
    assert_eq!(decoded[0], current);
    assert_eq!(
        decoded[1].body,
        EventBody::RunStarted(run_started_v1_expected())
    );
    assert_eq!(decoded[1].at, Timestamp(11));
}

#[test]
fn validated_records_refuse_a_body_that_does_not_decode_naming_its_position() {
    let mut bad = v1_record(&run_started_v1_message(), 0);
    bad.body = vec![0xFF, 0xFF, 0xFF].into();
    let good = gyre_log::encode_record(&gyre_event::Event::new(Timestamp(1), EventBody::Tick));
    let bytes = bytes::Bytes::from(encode_envelope(vec![good, bad]));
    match gyre_log::validated_records(&bytes) {
        Err(CodecError::Body { position, .. }) => assert_eq!(position, 1),
        other => panic!("expected a body error at position 1, got {other:?}"),
    }
}
