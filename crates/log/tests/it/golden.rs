//! Golden files: committed bytes that must stay readable forever.
//!
//! `testdata/golden/*.bin` were written once by [`golden_files_match_their_generators`] with
//! `GYRE_BLESS=1` (which only ever writes files that are missing). From then on the committed
//! bytes are the contract:
//! - every golden decodes to the value written here, through whatever upcasters it needs;
//! - a golden with a generator must still be reproduced byte for byte, so an encoding change
//!   that forgot to bump a schema version fails here;
//! - the goldens together hold every kind at its current version and at every version an
//!   upcaster reads.
//!
//! When a kind's schema version is bumped: keep the old files, set `generate: None` on those that
//! hold the old version (their bytes can no longer be produced, only read), update their expected
//! values to what the upcaster yields, and add a new golden for the new version.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gyre_event::{Event, EventBody, Timestamp};
use gyre_log::codec::upcast::UPCASTERS;
use gyre_log::codec::{
    current_schema_version, decode_batch, decode_envelope, encode_batch, encode_envelope,
    EventKind, ALL_KINDS,
};
use gyre_log::file::hex;
use gyre_log::{EventFileReader, EventFileWriter};
use gyre_proto::events as pb;

use crate::fixtures;
use crate::upcast::{run_started_v1_expected, run_started_v1_message, v1_record};

enum Contents {
    /// One encoded `EventBatch`.
    Batch {
        expected: fn() -> Vec<Event>,
        generate: Option<fn() -> Vec<u8>>,
    },
    /// An event file: the events of each record, and the head of the hash chain.
    File {
        expected: fn() -> Vec<Vec<Event>>,
        head_hash_hex: &'static str,
        generate: Option<fn() -> Vec<u8>>,
    },
}

struct Golden {
    name: &'static str,
    contents: Contents,
}

const GOLDENS: &[Golden] = &[
    Golden {
        name: "batch_f1_all_kinds.bin",
        contents: Contents::Batch {
            expected: fixtures::kinds_1_to_28,
            generate: Some(|| encode_batch(&fixtures::kinds_1_to_28())),
        },
    },
    Golden {
        name: "batch_f1_kinds_from_29.bin",
        contents: Contents::Batch {
            expected: fixtures::kinds_from_29,
            generate: Some(|| encode_batch(&fixtures::kinds_from_29())),
        },
    },
    Golden {
        name: "batch_f1_run_started_v1.bin",
        contents: Contents::Batch {
            expected: run_started_v1_batch_expected,
            generate: Some(run_started_v1_batch),
        },
    },
    Golden {
        name: "file_f1_three_records.bin",
        contents: Contents::File {
            expected: three_records_expected,
            head_hash_hex: "7ae2746e79c72371745369c7539f3e066c1bedb6cfd7942cbb3806f8f81ae709",
            generate: Some(three_records_file),
        },
    },
];

fn run_started_v1_batch() -> Vec<u8> {
    encode_envelope(vec![
        v1_record(&run_started_v1_message(), 11),
        pb::EventRecord {
            kind: EventKind::Tick as u32,
            schema_version: 1,
            at_nanos: 12,
            body: vec![].into(),
        },
    ])
}

fn run_started_v1_batch_expected() -> Vec<Event> {
    vec![
        Event::new(
            Timestamp(11),
            EventBody::RunStarted(run_started_v1_expected()),
        ),
        Event::new(Timestamp(12), EventBody::Tick),
    ]
}

fn three_records_expected() -> Vec<Vec<Event>> {
    let all = fixtures::kinds_1_to_28();
    vec![all[..10].to_vec(), all[10..].to_vec(), vec![]]
}

fn three_records_file() -> Vec<u8> {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("golden.log");
    let mut writer = EventFileWriter::create(&path).expect("create");
    let records = three_records_expected();
    writer.append_batch(&records[0]).expect("append");
    writer.append_batch(&records[1]).expect("append");
    writer.set_term(3);
    writer.append_batch(&records[2]).expect("append");
    writer.sync().expect("sync");
    std::fs::read(&path).expect("read back")
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/golden")
}

fn blessing() -> bool {
    std::env::var("GYRE_BLESS").is_ok_and(|value| value == "1")
}

#[test]
fn golden_files_match_their_generators() {
    let directory = golden_dir();
    for golden in GOLDENS {
        let generate = match &golden.contents {
            Contents::Batch { generate, .. } | Contents::File { generate, .. } => generate,
        };
        let path = directory.join(golden.name);
        let Some(generate) = generate else {
            assert!(
                path.exists(),
                "{}: frozen golden file is missing",
                path.display()
            );
            continue;
        };
        let generated = generate();
        match std::fs::read(&path) {
            Ok(committed) => assert!(
                committed == generated,
                "{}: the generator no longer reproduces the committed bytes. Committed bytes \
                 are the contract: if an encoding changed, bump that kind's schema version and \
                 add an upcaster and a new golden (see the module comment); never re-bless",
                path.display()
            ),
            Err(_) if blessing() => {
                std::fs::create_dir_all(&directory).expect("create testdata/golden");
                std::fs::write(&path, &generated).expect("write golden file");
                eprintln!("blessed {}", path.display());
            }
            Err(error) => panic!(
                "{}: {error}; write missing goldens with GYRE_BLESS=1 cargo test -p gyre-log golden",
                path.display()
            ),
        }
    }
}

fn decode_file(path: &Path) -> (Vec<Vec<Event>>, String, Vec<pb::EventBatch>) {
    let mut reader = EventFileReader::open(path).expect("open golden file");
    let mut events = Vec::new();
    let mut envelopes = Vec::new();
    for record in reader.by_ref() {
        let record = record.expect("golden file records are intact");
        envelopes.push(decode_envelope(&record.payload).expect("envelope"));
        events.push(record.decode_events_in(path).expect("golden batch decodes"));
    }
    (events, hex(&reader.head_hash()), envelopes)
}

#[test]
fn every_golden_file_decodes_to_its_expected_value() {
    let mut seen = 0;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("testdata/golden exists")
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .expect("utf-8 name");
        let golden = GOLDENS
            .iter()
            .find(|golden| golden.name == name)
            .unwrap_or_else(|| panic!("{name}: golden file with no expected value in golden.rs"));
        match &golden.contents {
            Contents::Batch { expected, .. } => {
                let bytes = std::fs::read(&path).expect("read golden");
                assert_eq!(decode_batch(&bytes).expect(name), expected(), "{name}");
            }
            Contents::File {
                expected,
                head_hash_hex,
                ..
            } => {
                let (events, head, _) = decode_file(&path);
                assert_eq!(events, expected(), "{name}");
                assert_eq!(&head, head_hash_hex, "{name}: head of the hash chain");
            }
        }
        seen += 1;
    }
    assert_eq!(
        seen,
        GOLDENS.len(),
        "every golden in golden.rs has a committed file"
    );
}

#[test]
fn goldens_hold_every_kind_at_every_readable_version() {
    let mut held = BTreeSet::new();
    for golden in GOLDENS {
        let path = golden_dir().join(golden.name);
        let envelopes = match golden.contents {
            Contents::Batch { .. } => {
                vec![decode_envelope(&std::fs::read(&path).expect("read golden")).expect("batch")]
            }
            Contents::File { .. } => decode_file(&path).2,
        };
        for record in envelopes.iter().flat_map(|batch| &batch.records) {
            held.insert((record.kind, record.schema_version));
        }
    }
    for kind in ALL_KINDS {
        let current = (kind as u32, current_schema_version(kind));
        assert!(
            held.contains(&current),
            "no golden holds {kind:?} v{}",
            current.1
        );
    }
    for step in UPCASTERS {
        assert!(
            held.contains(&(step.kind as u32, step.from_version)),
            "no golden holds {:?} v{}, which an upcaster reads",
            step.kind,
            step.from_version
        );
    }
}
