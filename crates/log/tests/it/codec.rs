//! The codec on hand-written inputs: round trips and every way bytes can be refused.

use std::collections::BTreeSet;

use gyre_event::{EventBody, Timestamp};
use gyre_log::codec::{
    current_schema_version, decode_batch, encode_batch, encode_envelope, kind_of, BodyError,
    CodecError, EventKind, ALL_KINDS, BATCH_MAGIC,
};
use gyre_proto::events as pb;
use prost::Message;

use crate::fixtures;

fn record(kind: EventKind, schema_version: u32, body: Vec<u8>) -> pb::EventRecord {
    pb::EventRecord {
        kind: kind as u32,
        schema_version,
        at_nanos: 5,
        body: body.into(),
    }
}

fn decode_one(record: pb::EventRecord) -> Result<Vec<gyre_event::Event>, CodecError> {
    decode_batch(&encode_envelope(vec![record]))
}

#[test]
fn every_kind_round_trips() {
    let events = fixtures::all_kinds();
    let bytes = encode_batch(&events);
    assert_eq!(decode_batch(&bytes).expect("decodes"), events);
}

#[test]
fn the_fixture_covers_every_kind_and_kind_numbers_are_dense() {
    let covered: BTreeSet<u32> = fixtures::all_kinds()
        .iter()
        .map(|event| kind_of(&event.body) as u32)
        .collect();
    let known: BTreeSet<u32> = ALL_KINDS.iter().map(|kind| *kind as u32).collect();
    assert_eq!(covered, known);
    assert_eq!(known, (1..=29).collect::<BTreeSet<u32>>());
}

#[test]
fn empty_batch_round_trips_and_starts_with_the_magic() {
    let bytes = encode_batch(&[]);
    assert_eq!(&bytes[..5], &[0x0D, b'G', b'Y', b'R', b'E']);
    assert_eq!(decode_batch(&bytes).expect("decodes"), vec![]);
    assert_eq!(BATCH_MAGIC, 0x4552_5947);
}

#[test]
fn log_probs_are_bit_exact_even_for_nan() {
    let mut record = fixtures::model_call();
    let odd = [f32::from_bits(0x7FC0_1234), -0.0, f32::NEG_INFINITY];
    record.output_logprobs = odd.to_vec();
    let bytes = encode_batch(&[gyre_event::Event::new(
        Timestamp(1),
        EventBody::ModelCall(Box::new(record)),
    )]);
    let decoded = decode_batch(&bytes).expect("decodes");
    let EventBody::ModelCall(decoded) = &decoded[0].body else {
        panic!("expected a model call, got {:?}", decoded[0].body);
    };
    let bits: Vec<u32> = decoded
        .output_logprobs
        .iter()
        .map(|lp| lp.to_bits())
        .collect();
    assert_eq!(bits, odd.iter().map(|lp| lp.to_bits()).collect::<Vec<_>>());
}

#[test]
fn token_ids_are_little_endian_bytes_on_the_wire() {
    let message = pb::ModelCall::decode(
        &*pb::EventBatch::decode(&*encode_batch(&[gyre_event::Event::new(
            Timestamp(1),
            EventBody::ModelCall(Box::new(fixtures::model_call())),
        )]))
        .expect("envelope")
        .records[0]
            .body,
    )
    .expect("body");
    assert_eq!(&message.input_ids[..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(message.output_logprobs.len(), 12);
    assert_eq!(&message.output_logprobs[..4], &(-0.125f32).to_le_bytes());
}

#[test]
fn writer_emits_current_schema_versions() {
    let batch = pb::EventBatch::decode(&*encode_batch(&fixtures::all_kinds())).expect("envelope");
    for record in &batch.records {
        let kind = EventKind::try_from(record.kind as i32).expect("known kind");
        assert_eq!(
            record.schema_version,
            current_schema_version(kind),
            "{kind:?}"
        );
    }
    assert_eq!(current_schema_version(EventKind::RunStarted), 2);
}

#[test]
fn foreign_bytes_are_bad_magic() {
    for bytes in [&b""[..], b"hello world", &[0xFF; 40]] {
        let error = decode_batch(bytes).expect_err("not a batch");
        assert!(
            matches!(error, CodecError::BadMagic { .. }),
            "{bytes:?}: {error}"
        );
        assert!(error.to_string().contains("bad magic"), "{error}");
    }
    let wrong_magic = pb::EventBatch {
        magic: 0x1234_5678,
        format_version: 1,
        records: vec![],
    }
    .encode_to_vec();
    assert_eq!(
        decode_batch(&wrong_magic),
        Err(CodecError::BadMagic {
            expected: BATCH_MAGIC,
            found: 0x1234_5678
        })
    );
}

#[test]
fn a_truncated_envelope_is_named_as_such() {
    let bytes = encode_batch(&fixtures::all_kinds());
    let error = decode_batch(&bytes[..bytes.len() / 2]).expect_err("truncated");
    assert!(matches!(error, CodecError::BadEnvelope { .. }), "{error}");
    assert!(
        error.to_string().contains("truncated or corrupt"),
        "{error}"
    );
}

#[test]
fn unknown_format_version_is_refused() {
    let bytes = pb::EventBatch {
        magic: BATCH_MAGIC,
        format_version: 2,
        records: vec![],
    }
    .encode_to_vec();
    assert_eq!(
        decode_batch(&bytes),
        Err(CodecError::UnsupportedFormatVersion {
            found: 2,
            supported: 1
        })
    );
}

#[test]
fn unknown_kind_is_refused_with_its_number_and_position() {
    let bytes = encode_envelope(vec![
        record(EventKind::Tick, 1, vec![]),
        pb::EventRecord {
            kind: 999,
            schema_version: 1,
            at_nanos: 0,
            body: vec![].into(),
        },
    ]);
    let error = decode_batch(&bytes).expect_err("unknown kind");
    assert_eq!(
        error,
        CodecError::UnknownKind {
            position: 1,
            kind: 999
        }
    );
    assert_eq!(
        error.to_string(),
        "event 1: unknown kind 999 (a newer writer, or corrupt bytes)"
    );
    let zero = decode_one(pb::EventRecord {
        kind: 0,
        ..record(EventKind::Tick, 1, vec![])
    });
    assert!(matches!(zero, Err(CodecError::UnknownKind { kind: 0, .. })));
}

#[test]
fn schema_versions_outside_the_readable_range_are_refused() {
    for version in [0, 2, 77] {
        let error = decode_one(record(EventKind::Tick, version, vec![])).expect_err("version");
        assert_eq!(
            error,
            CodecError::UnsupportedSchemaVersion {
                position: 0,
                kind: "tick",
                found: version,
                oldest: 1,
                current: 1
            }
        );
    }
    let error = decode_one(record(EventKind::RunStarted, 3, vec![])).expect_err("future");
    assert!(error.to_string().contains("versions 1..=2"), "{error}");
}

#[test]
fn token_bytes_not_a_multiple_of_four_are_refused() {
    let mut message = pb::ModelCall {
        kind: pb::CallKind::Turn as i32,
        ..Default::default()
    };
    message.input_ids = vec![1, 0, 0, 0, 2].into();
    let error =
        decode_one(record(EventKind::ModelCall, 1, message.encode_to_vec())).expect_err("odd");
    assert_eq!(
        error,
        CodecError::Body {
            position: 0,
            kind: "model_call",
            schema_version: 1,
            problem: BodyError::NotMultipleOf4 {
                field: "model_call.input_ids",
                length: 5
            }
        }
    );
    assert!(error.to_string().contains("not a multiple of 4"), "{error}");

    message.input_ids.clear();
    message.output_logprobs = vec![0; 7].into();
    let error =
        decode_one(record(EventKind::ModelCall, 1, message.encode_to_vec())).expect_err("odd");
    assert!(
        error.to_string().contains("model_call.output_logprobs"),
        "{error}"
    );
}

#[test]
fn invalid_enum_values_are_refused_naming_the_field() {
    for value in [0, 7, -1] {
        let body = pb::ExecutionClosed {
            execution: 1,
            status: value,
        }
        .encode_to_vec();
        let error = decode_one(record(EventKind::ExecutionClosed, 1, body)).expect_err("enum");
        assert_eq!(
            error,
            CodecError::Body {
                position: 0,
                kind: "execution_closed",
                schema_version: 1,
                problem: BodyError::InvalidEnum {
                    field: "execution_closed.status",
                    value
                }
            }
        );
    }
    let body = pb::TransitionBegun { cell: 0, to: 3 }.encode_to_vec();
    let error = decode_one(record(EventKind::TransitionBegun, 1, body)).expect_err("enum");
    assert_eq!(
        error.to_string(),
        "event 0 (transition_begun v1): `transition_begun.to` has invalid enum value 3"
    );
}

#[test]
fn a_digest_hash_must_be_32_bytes() {
    let body = pb::ProjectionDigest {
        upto: 1,
        hash: vec![1; 31],
        rules: 1,
    }
    .encode_to_vec();
    let error = decode_one(record(EventKind::ProjectionDigest, 1, body)).expect_err("length");
    assert!(
        error
            .to_string()
            .contains("`projection_digest.hash` holds 31 bytes, expected exactly 32"),
        "{error}"
    );
}

#[test]
fn a_truncated_body_is_named_as_such() {
    let body = pb::EngineDown {
        engine: 1,
        reason: "a long enough reason".to_string(),
    }
    .encode_to_vec();
    let error = decode_one(record(
        EventKind::EngineDown,
        1,
        body[..body.len() - 3].to_vec(),
    ))
    .expect_err("truncated");
    assert!(
        matches!(
            error,
            CodecError::Body {
                problem: BodyError::Protobuf(_),
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("(engine_down v1): body is truncated"),
        "{error}"
    );
}

#[test]
fn unknown_fields_in_a_body_are_skipped() {
    // A newer writer may add fields without bumping the version; old readers ignore them.
    let mut body = pb::BurstEnded { burst: 9 }.encode_to_vec();
    body.extend_from_slice(&[(15 << 3) as u8, 42]); // field 15, varint 42
    let events = decode_one(record(EventKind::BurstEnded, 1, body)).expect("decodes");
    assert_eq!(events[0].body, EventBody::BurstEnded { burst: 9 });
    assert_eq!(events[0].at, Timestamp(5));
}
