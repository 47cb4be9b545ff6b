//! Properties over random events and random damage.

use gyre_log::codec::{decode_batch, encode_batch};
use gyre_log::file::FILE_HEADER_LEN;
use gyre_log::{EventFileReader, EventFileWriter, FileError};
use proptest::prelude::*;

use crate::strategies;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_events_round_trip(events in strategies::events(12)) {
        let bytes = encode_batch(&events);
        prop_assert_eq!(decode_batch(&bytes).expect("decodes"), events);
    }

    #[test]
    fn byte_flips_never_panic(
        events in strategies::events(8),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8),
    ) {
        let mut bytes = encode_batch(&events);
        for (position, mask) in flips {
            let at = position.index(bytes.len());
            bytes[at] ^= mask;
        }
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn truncations_and_garbage_never_panic(
        events in strategies::events(8),
        cut in any::<prop::sample::Index>(),
        garbage in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let bytes = encode_batch(&events);
        let _ = decode_batch(&bytes[..cut.index(bytes.len() + 1)]);
        let _ = decode_batch(&garbage);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// One flipped byte anywhere in the records is caught at exactly the record it hit, and
    /// every record before it still reads back intact.
    #[test]
    fn a_flipped_byte_in_a_file_stops_the_reader_at_that_record(
        batches in proptest::collection::vec(strategies::events(4), 1..6),
        position in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("run.log");
        let mut writer = EventFileWriter::create(&path).expect("create");
        let appended: Vec<_> = batches
            .iter()
            .map(|batch| writer.append_batch(batch).expect("append"))
            .collect();
        writer.sync().expect("sync");
        let mut bytes = std::fs::read(&path).expect("read");
        let at = FILE_HEADER_LEN as usize
            + position.index(bytes.len() - FILE_HEADER_LEN as usize);
        bytes[at] ^= mask;
        std::fs::write(&path, &bytes).expect("write");

        let hit = appended
            .iter()
            .rposition(|record| record.offset as usize <= at)
            .expect("the flip lies in some record");
        let mut reader = EventFileReader::open(&path).expect("open");
        for (expected, batch) in appended.iter().zip(&batches).take(hit) {
            let record = reader.next().expect("a record").expect("intact");
            prop_assert_eq!(record.index, expected.index);
            prop_assert_eq!(record.hash, expected.hash);
            prop_assert_eq!(&record.decode_events_in(&path).expect("decodes"), batch);
        }
        let error = reader.next().expect("an error").expect_err("damage is detected");
        let offset = match &error {
            FileError::Torn { offset, .. }
            | FileError::BadChecksum { offset, .. }
            | FileError::BadFrame { offset, .. } => *offset,
            other => panic!("unexpected error {other}"),
        };
        prop_assert_eq!(offset, appended[hit].offset);
        prop_assert!(reader.next().is_none());
    }

    /// Whatever follows a valid header, the reader terminates without panicking and yields at
    /// most one error, last.
    #[test]
    fn garbage_records_never_panic_the_reader(
        garbage in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("run.log");
        drop(EventFileWriter::create(&path).expect("create"));
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend_from_slice(&garbage);
        std::fs::write(&path, &bytes).expect("write");
        let items: Vec<_> = EventFileReader::open(&path).expect("open").collect();
        let errors = items.iter().filter(|item| item.is_err()).count();
        prop_assert!(errors <= 1);
        if errors == 1 {
            prop_assert!(items.last().is_some_and(|item| item.is_err()));
        }
    }
}
