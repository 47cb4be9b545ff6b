//! The event file: round trips, torn tails, corruption in the middle, recovery, tampering.

use std::path::{Path, PathBuf};

use gyre_event::{Event, EventBody, Timestamp};
use gyre_log::file::{chain_hash, record_crc, FILE_HEADER_LEN, FRAME_HEADER_LEN, GENESIS_HASH};
use gyre_log::{AppendedRecord, EventFileReader, EventFileWriter, FileError, FileRecord};

use crate::fixtures;

fn batches() -> Vec<Vec<Event>> {
    let all = fixtures::all_kinds();
    vec![all[..9].to_vec(), all[9..20].to_vec(), all[20..].to_vec()]
}

/// Writes `batches()` into a fresh file; returns the directory guard, path and append results.
fn written() -> (tempfile::TempDir, PathBuf, Vec<AppendedRecord>) {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("run.log");
    let mut writer = EventFileWriter::create(&path).expect("create");
    let appended = batches()
        .iter()
        .map(|batch| writer.append_batch(batch).expect("append"))
        .collect();
    writer.sync().expect("sync");
    (directory, path, appended)
}

fn read(path: &Path) -> (Vec<FileRecord>, Option<FileError>) {
    let mut records = Vec::new();
    let mut error = None;
    for item in EventFileReader::open(path).expect("open") {
        match item {
            Ok(record) => records.push(record),
            Err(failure) => {
                assert!(error.is_none(), "the reader yields at most one error");
                error = Some(failure);
            }
        }
    }
    (records, error)
}

fn modify(path: &Path, change: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).expect("read");
    change(&mut bytes);
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn appended_batches_read_back_with_their_indexes_and_chain() {
    let (_directory, path, appended) = written();
    let (records, error) = read(&path);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(records.len(), 3);
    let mut previous = GENESIS_HASH;
    for ((record, appended), batch) in records.iter().zip(&appended).zip(batches()) {
        assert_eq!(record.index, appended.index);
        assert_eq!(record.offset, appended.offset);
        assert_eq!(record.hash, appended.hash);
        assert_eq!(record.term, 0);
        assert_eq!(
            record.hash,
            chain_hash(&previous, record.index, record.term, &record.payload)
        );
        assert_eq!(record.decode_events_in(&path).expect("decodes"), batch);
        previous = record.hash;
    }
    assert_eq!(
        appended.iter().map(|a| a.index).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(appended[0].offset, FILE_HEADER_LEN);
    let all = EventFileReader::read_all_events(&path).expect("read all");
    assert_eq!(all.len(), 3);
    assert_eq!(all[2].1, batches()[2]);
}

#[test]
fn create_refuses_to_overwrite() {
    let (_directory, path, _) = written();
    let error = EventFileWriter::create(&path).expect_err("exists");
    assert!(
        matches!(
            &error,
            FileError::Io {
                action: "create",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn a_torn_tail_is_reported_at_every_cut_point() {
    let (_directory, path, appended) = written();
    let full = std::fs::read(&path).expect("read");
    let last = appended[2].offset as usize;
    for cut in last + 1..full.len() {
        std::fs::write(&path, &full[..cut]).expect("write");
        let (records, error) = read(&path);
        assert_eq!(records.len(), 2, "cut at {cut}");
        match error {
            Some(FileError::Torn { offset, index, .. }) => {
                assert_eq!((offset, index), (last as u64, 3), "cut at {cut}")
            }
            other => panic!("cut at {cut}: expected a torn tail, got {other:?}"),
        }
    }
}

#[test]
fn a_zero_filled_tail_is_torn() {
    let (_directory, path, appended) = written();
    let end = std::fs::metadata(&path).expect("metadata").len();
    modify(&path, |bytes| bytes.extend_from_slice(&[0; 4096]));
    let (records, error) = read(&path);
    assert_eq!(records.len(), 3);
    match error {
        Some(FileError::Torn { offset, index, .. }) => assert_eq!((offset, index), (end, 4)),
        other => panic!("expected a torn tail, got {other:?}"),
    }
    assert!(appended[2].offset < end);
}

#[test]
fn a_bad_checksum_in_the_middle_names_file_offset_and_index() {
    let (_directory, path, appended) = written();
    let target = appended[1].offset as usize + FRAME_HEADER_LEN as usize + 10;
    modify(&path, |bytes| bytes[target] ^= 0x40);
    let (records, error) = read(&path);
    assert_eq!(
        records.len(),
        1,
        "the record before the damage is still readable"
    );
    let error = error.expect("an error");
    match &error {
        FileError::BadChecksum { offset, index, .. } => {
            assert_eq!((*offset, *index), (appended[1].offset, 2))
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains(&format!("record 2 at byte offset {}", appended[1].offset)),
        "{message}"
    );
}

#[test]
fn a_bad_checksum_in_the_last_record_is_corruption_not_a_torn_tail() {
    let (_directory, path, _) = written();
    modify(&path, |bytes| {
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
    });
    let (records, error) = read(&path);
    assert_eq!(records.len(), 2);
    assert!(
        matches!(error, Some(FileError::BadChecksum { index: 3, .. })),
        "{error:?}"
    );
}

#[test]
fn an_absurd_length_is_corruption_not_a_torn_tail() {
    let (_directory, path, appended) = written();
    let at = appended[1].offset as usize;
    modify(&path, |bytes| bytes[at + 3] = 0xFF);
    let (records, error) = read(&path);
    assert_eq!(records.len(), 1);
    let error = error.expect("an error");
    assert!(
        matches!(&error, FileError::BadFrame { index: 2, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("exceeds the limit"), "{error}");
}

#[test]
fn an_index_out_of_sequence_is_refused() {
    let (_directory, path, appended) = written();
    let at = appended[1].offset as usize;
    modify(&path, |bytes| {
        // Rewrite record 2 as index 7 with a valid CRC: well-formed, but out of sequence.
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let payload_at = at + FRAME_HEADER_LEN as usize;
        let crc = record_crc(7, 0, &bytes[payload_at..payload_at + len]);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        bytes[at + 8..at + 16].copy_from_slice(&7u64.to_le_bytes());
    });
    let (records, error) = read(&path);
    assert_eq!(records.len(), 1);
    let error = error.expect("an error");
    assert!(
        error
            .to_string()
            .contains("index out of sequence: expected 2, found 7"),
        "{error}"
    );
}

#[test]
fn bad_headers_are_refused() {
    let (_directory, path, _) = written();
    modify(&path, |bytes| bytes[20] ^= 1);
    let error = EventFileReader::open(&path).err().expect("bad header");
    assert!(
        error.to_string().contains("header checksum mismatch"),
        "{error}"
    );

    std::fs::write(&path, b"GYRE-EVF").expect("write");
    let error = EventFileReader::open(&path).err().expect("short");
    assert!(
        error
            .to_string()
            .contains("shorter than the 60-byte header"),
        "{error}"
    );

    std::fs::write(&path, [b'x'; 100]).expect("write");
    let error = EventFileReader::open(&path).err().expect("foreign");
    assert!(
        error.to_string().contains("not a Gyre event file"),
        "{error}"
    );
}

#[test]
fn open_append_truncates_a_torn_tail_and_continues_the_chain() {
    let (_directory, path, appended) = written();
    modify(&path, |bytes| {
        let cut = bytes.len() - 5;
        bytes.truncate(cut)
    });
    let (mut writer, recovered) = EventFileWriter::open_append(&path).expect("recover");
    assert_eq!(recovered.records_count, 2);
    assert_eq!(recovered.truncated_torn_tail_at, Some(appended[2].offset));
    assert_eq!(writer.next_index(), 3);
    assert_eq!(writer.head_hash(), appended[1].hash);
    let again = writer.append_batch(&batches()[2]).expect("append");
    writer.sync().expect("sync");
    assert_eq!(
        again, appended[2],
        "the re-appended record is identical to the lost one"
    );
    let (records, error) = read(&path);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(records.len(), 3);
}

#[test]
fn open_append_refuses_corruption_in_the_middle() {
    let (_directory, path, appended) = written();
    let target = appended[0].offset as usize + FRAME_HEADER_LEN as usize + 1;
    modify(&path, |bytes| bytes[target] ^= 0xFF);
    let error = EventFileWriter::open_append(&path).expect_err("corrupt");
    assert!(
        matches!(error, FileError::BadChecksum { index: 1, .. }),
        "{error}"
    );
}

#[test]
fn a_file_may_start_mid_log() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("export.log");
    let base = [7u8; 32];
    let mut writer = EventFileWriter::create_at(&path, 100, base).expect("create");
    writer.set_term(4);
    let tick = vec![Event::new(Timestamp(1), EventBody::Tick)];
    let appended = writer.append_batch(&tick).expect("append");
    writer.sync().expect("sync");
    assert_eq!(appended.index, 100);
    let (records, error) = read(&path);
    assert!(error.is_none());
    assert_eq!(records[0].index, 100);
    assert_eq!(records[0].term, 4);
    assert_eq!(
        records[0].hash,
        chain_hash(&base, 100, 4, &records[0].payload)
    );
    let reader = EventFileReader::open(&path).expect("open");
    assert_eq!(reader.header().first_index, 100);
    assert_eq!(reader.header().base_hash, base);
}

#[test]
fn rewriting_a_record_with_a_fresh_crc_changes_the_head_hash() {
    // A forger who fixes up the CRC passes the accident check, but not the chain: the trusted
    // head hash no longer matches.
    let (_directory, path, appended) = written();
    let trusted_head = appended[2].hash;
    let at = appended[0].offset as usize;
    modify(&path, |bytes| {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let payload_at = at + FRAME_HEADER_LEN as usize;
        bytes[payload_at + len - 1] ^= 1;
        let crc = record_crc(1, 0, &bytes[payload_at..payload_at + len]);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
    });
    let mut reader = EventFileReader::open(&path).expect("open");
    let records: Vec<_> = reader.by_ref().collect();
    assert!(records.iter().all(|record| record.is_ok()));
    assert_ne!(reader.head_hash(), trusted_head);
}

#[test]
fn a_multi_megabyte_tito_record_round_trips() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("big.log");
    let mut record = fixtures::model_call();
    record.input_ids = (0..1_000_000u32).collect();
    record.input_provenance = vec![gyre_event::ProvenanceSpan {
        provenance: gyre_event::Provenance::User,
        tokens_count: 1_000_000,
    }];
    record.output_ids = (0..100_000u32).rev().collect();
    record.output_logprobs = (0..100_000u32).map(|i| -(i as f32) / 1e5).collect();
    let batch = vec![Event::new(
        Timestamp(1),
        EventBody::ModelCall(Box::new(record)),
    )];
    let mut writer = EventFileWriter::create(&path).expect("create");
    writer.append_batch(&batch).expect("append");
    writer.sync().expect("sync");
    assert!(writer.len_bytes() > 4_000_000);
    let all = EventFileReader::read_all_events(&path).expect("read");
    assert_eq!(all, vec![(1, batch)]);
}

/// A record read back by the offset its append returned: the same events; an offset that is
/// not a record's frame, or a flipped payload byte, is an error naming the offset.
#[test]
fn a_record_reads_back_at_its_offset() {
    let (_directory, path, appended) = written();
    for (record, batch) in appended.iter().zip(batches()) {
        let events = EventFileReader::events_at(&path, record.offset).expect("reads");
        assert_eq!(events, batch);
    }
    let middle = appended[1].offset;
    match EventFileReader::events_at(&path, middle + 3) {
        Err(FileError::BadChecksum { .. } | FileError::BadFrame { .. }) => {}
        other => panic!("a misaligned offset is refused: {other:?}"),
    }
    let length = std::fs::metadata(&path).expect("metadata").len();
    match EventFileReader::events_at(&path, length) {
        Err(FileError::BadFrame { offset, .. }) => assert_eq!(offset, length),
        other => panic!("an offset past the end is refused: {other:?}"),
    }
    modify(&path, |bytes| {
        bytes[(middle + FRAME_HEADER_LEN) as usize] ^= 0x40;
    });
    match EventFileReader::events_at(&path, middle) {
        Err(FileError::BadChecksum { offset, .. }) => assert_eq!(offset, middle),
        other => panic!("a flipped byte is refused: {other:?}"),
    }
    assert_eq!(
        EventFileReader::events_at(&path, appended[0].offset).expect("reads"),
        batches()[0]
    );
}

/// Appends land in space reserved past the end (`fallocate` keeping the size): while the
/// writer is open the file holds more blocks than its records need, its size is still exactly
/// the records' end (readers, and an `open_append` after a crash, see nothing else), and
/// dropping the writer gives the reserved space back.
#[test]
fn space_reserved_past_the_end_keeps_the_size_and_is_given_back() {
    use std::os::unix::fs::MetadataExt;
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("run.log");
    let mut writer = EventFileWriter::create(&path).expect("create");
    for batch in batches() {
        writer.append_batch(&batch).expect("append");
    }
    writer.sync().expect("sync");
    let open = std::fs::metadata(&path).expect("metadata");
    assert_eq!(
        open.len(),
        writer.len_bytes(),
        "the size is the records' end"
    );
    let reserving = open.blocks() * 512 > open.len() + (1 << 20);
    // A crash leaves the reservation behind: reopening appends right after the last record.
    let (records, error) = read(&path);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(records.len(), 3);
    drop(writer);
    let closed = std::fs::metadata(&path).expect("metadata");
    assert_eq!(closed.len(), open.len());
    if reserving {
        assert!(
            closed.blocks() * 512 < open.blocks() * 512,
            "dropping the writer gives the reserved space back ({} → {} bytes allocated)",
            open.blocks() * 512,
            closed.blocks() * 512
        );
    } else {
        eprintln!(
            "this file system does not reserve space (fallocate KEEP_SIZE): nothing to give back"
        );
    }
    let (mut writer, recovered) = EventFileWriter::open_append(&path).expect("reopen");
    assert_eq!(recovered.records_count, 3);
    assert_eq!(recovered.truncated_torn_tail_at, None);
    writer.append_batch(&batches()[0]).expect("append");
    writer.sync().expect("sync");
    drop(writer);
    let (records, error) = read(&path);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(records.len(), 4);
}

/// One writer per file: a second `open_append` waits for the first writer to let go (a sink
/// being replaced), then goes on after its records, so nothing either wrote is lost; and space
/// a writer that never let go cleanly left reserved past the end (a crash) is given back when
/// the file is opened again.
#[test]
fn a_second_writer_waits_for_the_first_and_a_crash_reservation_is_given_back() {
    use std::os::unix::fs::MetadataExt;
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("run.log");
    let mut first = EventFileWriter::create(&path).expect("create");
    first.append_batch(&batches()[0]).expect("append");
    first.sync().expect("sync");
    let second = {
        let path = path.clone();
        std::thread::spawn(move || {
            let (mut second, recovered) = EventFileWriter::open_append(&path).expect("reopen");
            second.append_batch(&batches()[2]).expect("append");
            second.sync().expect("sync");
            (second.len_bytes(), recovered.records_count)
        })
    };
    // Whether or not the second writer is already waiting, the first one's record goes in
    // before it reads the file.
    first.append_batch(&batches()[1]).expect("append");
    first.sync().expect("sync");
    drop(first);
    let (end, seen) = second.join().expect("the second writer");
    assert_eq!(
        seen, 2,
        "the second writer went on after both of the first's records"
    );
    let (records, error) = read(&path);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(records.len(), 3);
    assert_eq!(std::fs::metadata(&path).expect("metadata").len(), end);
    // What a crashed writer leaves: space reserved past the end, the size unchanged.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    let reserved =
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::KEEP_SIZE, end, 8 << 20).is_ok();
    drop(file);
    let crashed = std::fs::metadata(&path).expect("metadata");
    assert_eq!(crashed.len(), end);
    let (reopened, recovered) = EventFileWriter::open_append(&path).expect("reopen");
    assert_eq!(recovered.records_count, 3);
    assert_eq!(recovered.truncated_torn_tail_at, None);
    assert_eq!(reopened.len_bytes(), end);
    if reserved {
        assert!(
            std::fs::metadata(&path).expect("metadata").blocks() * 512 < end + (1 << 20),
            "open_append gives the crashed writer's reservation back"
        );
    }
}
