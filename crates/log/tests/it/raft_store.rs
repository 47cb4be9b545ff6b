//! The Raft log store and state machine on their own: openraft's conformance suite, recovery
//! from a torn tail, refusal of mid-log corruption, segment rollover and purge, group commit,
//! large entries, and restart after purge + snapshot.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gyre_event::{Event, EventBody, Timestamp};
use gyre_log::raft::openraft::storage::{RaftLogStorage, RaftStateMachine};
use gyre_log::raft::openraft::testing::{StoreBuilder, Suite};
use gyre_log::raft::openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder, StorageHelper};
use gyre_log::raft::segment::scan_segment;
use gyre_log::raft::{
    log_id, open_storage, Entry, EventBatchBytes, LogStore, LogStoreOptions, Membership,
    RaftStoreError, StateMachineStore, StorageError,
};
use tempfile::TempDir;

use super::fixtures::model_call;
use super::raft_support::{
    append_durable, batch, blank, close, normal, segment_files, CountingProjection,
};

type Sm = StateMachineStore<CountingProjection>;

/// Builds a snapshot of `sm` as openraft does and waits for it.
async fn build_snapshot<P: gyre_log::raft::Projection>(
    sm: &mut StateMachineStore<P>,
) -> gyre_log::raft::Snapshot {
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("snapshot")
}

fn tiny_segments() -> LogStoreOptions {
    LogStoreOptions {
        segment_bytes: 1024,
        ..LogStoreOptions::default()
    }
}

struct Builder;

impl StoreBuilder<gyre_log::raft::TypeConfig, LogStore, Sm, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, Sm), StorageError> {
        let dir = TempDir::new().expect("temp dir");
        let (log, sm) = open_storage::<CountingProjection>(dir.path(), tiny_segments())
            .expect("fresh storage opens");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_suite_passes() {
    Suite::test_all(Builder).expect("openraft's storage suite passes");
}

/// Entries 0..count: a membership entry, then batches whose marker is the index.
fn sample_entries(count: u64) -> Vec<Entry> {
    (0..count)
        .map(|index| {
            if index == 0 {
                Entry {
                    log_id: log_id(1, 1, 0),
                    payload: EntryPayload::Membership(Membership::new(
                        vec![[1u64, 2, 3].into_iter().collect()],
                        None,
                    )),
                }
            } else {
                normal(1, index, batch(index, 3))
            }
        })
        .collect()
}

async fn read_all(log: &mut LogStore) -> Vec<Entry> {
    log.try_get_log_entries(..).await.expect("log reads")
}

fn open_log(dir: &Path) -> Result<LogStore, RaftStoreError> {
    LogStore::open(dir, tiny_segments())
}

#[tokio::test]
async fn entries_are_readable_when_append_returns_and_after_reopen() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = open_log(dir.path()).expect("opens");
    let entries = sample_entries(12);
    let handle = log.handle();
    {
        // Hold the writer so nothing is written yet: the entries must still be readable.
        let pause = handle.pause_writer();
        log.append_then(entries.clone(), |_| {}).expect("accepted");
        let read = read_all(&mut log).await;
        assert_eq!(format!("{read:?}"), format!("{entries:?}"));
        drop(pause);
    }
    close(log).await;
    let mut log = open_log(dir.path()).expect("reopens");
    let read = read_all(&mut log).await;
    assert_eq!(format!("{read:?}"), format!("{entries:?}"));
    for (read, written) in read.iter().zip(&entries) {
        if let (EntryPayload::Normal(read), EntryPayload::Normal(written)) =
            (&read.payload, &written.payload)
        {
            assert_eq!(read, written, "payload bytes survive");
        }
    }
}

#[tokio::test]
async fn torn_tail_is_truncated_on_open() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = open_log(dir.path()).expect("opens");
    append_durable(&mut log, sample_entries(10)).await;
    close(log).await;

    // Cut the last record in half, as a crash in the middle of a write would (the segment
    // may be preallocated: cut at the end of its records, not of the file).
    let last = segment_files(dir.path()).pop().expect("a segment");
    let end = scan_segment(&last, |_, _| Ok(()))
        .expect("scans")
        .end_offset;
    OpenOptions::new()
        .write(true)
        .open(&last)
        .expect("open")
        .set_len(end - 7)
        .expect("cut");

    let mut log = open_log(dir.path()).expect("a torn tail is recovered, not refused");
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 8)));
    assert_eq!(read_all(&mut log).await.len(), 9);
    // The log continues where it was cut.
    append_durable(&mut log, vec![normal(2, 9, batch(99, 1))]).await;
    close(log).await;

    // A zero-filled tail (the file grew but the data never arrived) is torn too.
    let last = segment_files(dir.path()).pop().expect("a segment");
    let mut file = OpenOptions::new().append(true).open(&last).expect("open");
    file.write_all(&[0u8; 100]).expect("extend with zeros");
    drop(file);
    let mut log = open_log(dir.path()).expect("zero tail is recovered");
    let entries = read_all(&mut log).await;
    assert_eq!(entries.len(), 10);
    assert_eq!(entries[9].log_id, log_id(2, 1, 9));
}

#[tokio::test]
async fn mid_log_corruption_is_refused_naming_segment_and_offset() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = open_log(dir.path()).expect("opens");
    append_durable(&mut log, sample_entries(30)).await;
    close(log).await;
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 3, "tiny segments roll over: {segments:?}");

    // Flip one payload byte of the second record of the second segment.
    let victim = &segments[1];
    let mut records = Vec::new();
    scan_segment(victim, |record, _| {
        records.push(*record);
        Ok(())
    })
    .expect("intact before the flip");
    let record = records[1];
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(victim)
        .expect("open");
    let at = record.offset + 24 + 12;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).expect("read");
    file.write_all_at(&[byte[0] ^ 0x40], at).expect("flip");
    drop(file);

    let error = open_log(dir.path()).err().expect("corruption is refused");
    match &error {
        RaftStoreError::CorruptRecord {
            segment,
            offset,
            index,
            ..
        } => {
            assert_eq!(segment, victim);
            assert_eq!(*offset, record.offset);
            assert_eq!(*index, record.index);
        }
        other => panic!("expected CorruptRecord, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains(&victim.display().to_string())
            && message.contains(&format!("byte offset {}", record.offset))
            && message.contains("checksum mismatch"),
        "{message}"
    );
}

#[tokio::test]
async fn rollover_and_purge_delete_whole_segments() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = open_log(dir.path()).expect("opens");
    append_durable(&mut log, sample_entries(40)).await;
    let before = segment_files(dir.path());
    assert!(before.len() >= 4, "{before:?}");
    let stats = log.stats();
    assert_eq!(stats.segments_created as usize, before.len());

    log.purge(log_id(1, 1, 20)).await.expect("purge");
    let after = segment_files(dir.path());
    assert!(after.len() < before.len(), "whole segments were deleted");
    // Every remaining segment holds something above the purge point, except possibly the
    // first, which holds index 21.
    let first_remaining = gyre_log::raft::segment::parse_segment_file_name(
        &after[0].file_name().expect("name").to_string_lossy(),
    )
    .expect("segment name");
    assert!(first_remaining <= 21, "entry 21 is still on disk");
    let second = gyre_log::raft::segment::parse_segment_file_name(
        &after[1].file_name().expect("name").to_string_lossy(),
    )
    .expect("segment name");
    assert!(second > 21, "the first kept segment is the one holding 21");

    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 20)));
    let entries = read_all(&mut log).await;
    assert_eq!(entries.first().map(|entry| entry.log_id.index), Some(21));
    assert_eq!(entries.len(), 19);
    close(log).await;

    // After a restart the purge point holds and the chain still verifies across segments.
    let mut log = open_log(dir.path()).expect("reopens after purge");
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 20)));
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 39)));
    assert_eq!(read_all(&mut log).await.len(), 19);
}

#[tokio::test]
async fn truncate_across_segments_then_append_survives_reopen() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = open_log(dir.path()).expect("opens");
    append_durable(&mut log, sample_entries(30)).await;
    log.truncate(log_id(1, 1, 12)).await.expect("truncate");
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 11)));
    let replacement: Vec<Entry> = (12..16)
        .map(|index| normal(3, index, batch(1000 + index, 2)))
        .collect();
    append_durable(&mut log, replacement).await;
    close(log).await;

    let mut log = open_log(dir.path()).expect("reopens");
    let entries = read_all(&mut log).await;
    assert_eq!(entries.len(), 16);
    assert_eq!(entries[11].log_id, log_id(1, 1, 11));
    assert_eq!(entries[12].log_id, log_id(3, 1, 12));
    assert_eq!(entries[15].log_id, log_id(3, 1, 15));
}

#[tokio::test]
async fn group_commit_uses_one_fdatasync_per_group() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = LogStore::open(dir.path(), LogStoreOptions::default()).expect("opens");
    let handle = log.handle();
    let durable = Arc::new(AtomicUsize::new(0));
    let appends = 50u64;
    let (all_done, all_durable) = tokio::sync::oneshot::channel();
    let all_done = Arc::new(std::sync::Mutex::new(Some(all_done)));
    {
        let pause = handle.pause_writer();
        for index in 0..appends {
            let durable = durable.clone();
            let all_done = all_done.clone();
            log.append_then(vec![normal(1, index, batch(index, 4))], move |result| {
                result.expect("durable");
                if durable.fetch_add(1, Ordering::AcqRel) + 1 == appends as usize {
                    if let Some(done) = all_done.lock().expect("lock").take() {
                        let _ = done.send(());
                    }
                }
            })
            .expect("accepted");
        }
        drop(pause);
    }
    all_durable.await.expect("every append completes");
    let stats = handle.stats();
    assert_eq!(stats.records, appends);
    assert_eq!(stats.groups, 1, "{stats:?}");
    assert_eq!(
        stats.group_syncs, 1,
        "one fdatasync for 50 queued appends: {stats:?}"
    );
    assert_eq!(stats.rollover_syncs, 0);

    // One append of many entries is one group too.
    let many: Vec<Entry> = (appends..appends + 200)
        .map(|index| normal(1, index, batch(index, 2)))
        .collect();
    append_durable(&mut log, many).await;
    let stats = handle.stats();
    assert_eq!(
        (stats.groups, stats.group_syncs, stats.records),
        (2, 2, appends + 200)
    );
}

fn token_record_events(tokens_count: usize) -> Vec<Event> {
    let mut call = model_call();
    call.input_ids = (0..tokens_count as u32).collect();
    call.input_provenance = vec![gyre_event::ProvenanceSpan {
        provenance: gyre_event::Provenance::Template,
        tokens_count: tokens_count as u32,
    }];
    vec![Event {
        at: Timestamp(1),
        body: EventBody::ModelCall(Box::new(call)),
    }]
}

#[tokio::test]
async fn multi_megabyte_entries_round_trip_and_replication_reads_are_bounded_by_bytes() {
    let dir = TempDir::new().expect("temp dir");
    let options = LogStoreOptions {
        segment_bytes: 4 << 20,
        read_batch_bytes_max: 8 << 20,
        read_batch_entries_max: 300,
        preallocate: true,
        archive: false,
        archive_bytes_max: 0,
    };
    let mut log = LogStore::open(dir.path(), options).expect("opens");
    // ~3 MiB each: 768k token ids of 4 bytes.
    let big = EventBatchBytes::encode(&token_record_events(768 << 10));
    assert!(big.len() > 3 << 20, "{} bytes", big.len());
    let entries: Vec<Entry> = (0..5).map(|index| normal(1, index, big.clone())).collect();
    append_durable(&mut log, entries).await;

    let mut reader = log.reader();
    let limited = reader.limited_get_log_entries(0, 5).await.expect("reads");
    assert_eq!(
        limited.len(),
        2,
        "two ~3 MiB entries fit in 8 MiB, three do not"
    );
    let one = reader.limited_get_log_entries(4, 5).await.expect("reads");
    assert_eq!(one.len(), 1);
    close(log).await;

    let mut log = LogStore::open(dir.path(), options).expect("reopens");
    let entries = read_all(&mut log).await;
    assert_eq!(entries.len(), 5);
    for entry in entries {
        match entry.payload {
            EntryPayload::Normal(batch) => {
                assert_eq!(batch, big);
                let events = gyre_log::decode_batch(&batch.0).expect("decodes");
                assert_eq!(events, token_record_events(768 << 10));
            }
            other => panic!("expected a batch, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn restart_after_purge_and_snapshot_restores_then_replays_the_suffix() {
    let dir = TempDir::new().expect("temp dir");
    let (mut log, mut sm) =
        open_storage::<CountingProjection>(dir.path(), tiny_segments()).expect("opens");
    let entries = sample_entries(51);
    append_durable(&mut log, entries.clone()).await;
    let replies = sm.apply(entries[..31].to_vec()).await.expect("apply");
    assert_eq!(
        replies.len(),
        31,
        "one reply per entry, membership included"
    );
    let snapshot = build_snapshot(&mut sm).await;
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 1, 30)));
    sm.apply(entries[31..].to_vec())
        .await
        .expect("apply the rest");
    let before = sm.digest();
    assert_eq!(before.0, Some(log_id(1, 1, 50)));
    log.purge(log_id(1, 1, 25)).await.expect("purge");
    log.save_committed(Some(log_id(1, 1, 50)))
        .await
        .expect("committed");
    close(log).await;
    drop(sm);

    let (mut log, mut sm) =
        open_storage::<CountingProjection>(dir.path(), tiny_segments()).expect("reopens");
    assert_eq!(
        sm.digest().0,
        Some(log_id(1, 1, 30)),
        "restored from the snapshot"
    );
    // What Raft::new does: re-apply the committed suffix on top of the snapshot.
    let state = StorageHelper::new(&mut log, &mut sm)
        .get_initial_state()
        .await
        .expect("initial state after purge + snapshot");
    assert_eq!(state.committed, Some(log_id(1, 1, 50)));
    assert_eq!(sm.digest(), before, "the suffix replays to the same state");
    sm.with_projection(|projection, _| {
        assert_eq!(projection.batches, 50);
        assert_eq!(projection.markers.len(), 50);
    });
}

#[tokio::test]
async fn snapshots_keep_the_last_two_and_a_damaged_newest_falls_back() {
    let dir = TempDir::new().expect("temp dir");
    let (_log, mut sm) =
        open_storage::<CountingProjection>(dir.path(), tiny_segments()).expect("opens");
    let entries = sample_entries(10);
    let mut digests = Vec::new();
    for upto in [3usize, 6, 10] {
        let done = digests.len();
        let start = [0usize, 3, 6][done];
        sm.apply(entries[start..upto].to_vec())
            .await
            .expect("apply");
        build_snapshot(&mut sm).await;
        digests.push(sm.digest());
    }
    let mut files: Vec<_> = std::fs::read_dir(dir.path().join("snapshots"))
        .expect("snapshot dir")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    drop(sm);

    // Damage the newest body: the older one is used.
    let newest = files.last().expect("newest");
    let len = std::fs::metadata(newest).expect("metadata").len();
    let file = OpenOptions::new().write(true).open(newest).expect("open");
    file.write_all_at(&[0xFF], len - 1).expect("flip");
    drop(file);
    let sm = StateMachineStore::<CountingProjection>::open(dir.path()).expect("falls back");
    assert_eq!(sm.digest(), digests[1]);
    let _ = blank(1, 0);
}

/// A directory where the snapshot file written last holds less of the log than an earlier one
/// (a build that raced an install of a newer snapshot left that before the build learnt to
/// step aside, `snapshot::tests`): a restart restores the one holding more, since the log
/// before it may be purged and `Raft::new` could not re-apply the entries after the other.
#[tokio::test]
async fn a_restart_restores_the_snapshot_holding_the_most_of_the_log() {
    let entries = sample_entries(10);
    let mut built = Vec::new();
    for upto in [3usize, 10] {
        let dir = TempDir::new().expect("temp dir");
        let (_log, mut sm) =
            open_storage::<CountingProjection>(dir.path(), tiny_segments()).expect("opens");
        sm.apply(entries[..upto].to_vec()).await.expect("apply");
        let snapshot = build_snapshot(&mut sm).await;
        let bytes = snapshot.snapshot.read_bytes().expect("reads");
        built.push((snapshot.meta, bytes, sm.digest(), dir));
    }
    let (_, old_bytes, _, _) = &built[0];
    let (_, new_bytes, new_digest, _) = &built[1];

    let dir = TempDir::new().expect("temp dir");
    let snapshots = dir.path().join("snapshots");
    std::fs::create_dir_all(&snapshots).expect("mkdir");
    std::fs::write(snapshots.join(format!("snap-{:020}.snap", 1)), new_bytes).expect("write");
    std::fs::write(snapshots.join(format!("snap-{:020}.snap", 2)), old_bytes).expect("write");
    let sm = StateMachineStore::<CountingProjection>::open(dir.path()).expect("opens");
    assert_eq!(sm.digest(), *new_digest);
}

/// Appends entries `*next..` one durable append at a time (each of `events` events) until the
/// writer has created `preallocated` preallocated segments, then `extra` more.
async fn append_until_preallocated(
    log: &mut LogStore,
    next: &mut u64,
    events: usize,
    preallocated: u64,
    extra: u64,
) {
    let handle = log.handle();
    let mut appended = 0;
    while handle.stats().segments_preallocated < preallocated {
        assert!(
            appended < 20_000,
            "no segment was preallocated in {appended} appends"
        );
        append_durable(log, vec![normal(1, *next, batch(*next, events))]).await;
        *next += 1;
        appended += 1;
    }
    for _ in 0..extra {
        append_durable(log, vec![normal(1, *next, batch(*next, events))]).await;
        *next += 1;
    }
}

fn prealloc_options(segment_bytes: u64) -> LogStoreOptions {
    LogStoreOptions {
        segment_bytes,
        preallocate: true,
        ..LogStoreOptions::default()
    }
}

#[tokio::test]
async fn preallocated_segments_are_zero_filled_trimmed_when_closed_and_continue_after_reopen() {
    let dir = TempDir::new().expect("temp dir");
    let options = prealloc_options(8 << 10);
    let mut log = LogStore::open(dir.path(), options).expect("opens");
    let mut next = 0;
    append_until_preallocated(&mut log, &mut next, 3, 3, 2).await;
    let stats = log.stats();
    assert!(stats.segments_preallocated >= 3, "{stats:?}");
    close(log).await;

    // Closed segments are trimmed to their records; the active one is a zero-filled file of
    // `segment_bytes` whose records end before the zeros.
    let files = segment_files(dir.path());
    let (active, closed) = files.split_last().expect("segments");
    for path in closed {
        let scan = scan_segment(path, |_, _| Ok(())).expect("scans");
        assert_eq!(
            scan.end_offset,
            scan.file_len,
            "{} is trimmed",
            path.display()
        );
        assert!(!scan.torn && !scan.zero_tail);
    }
    let scan = scan_segment(active, |_, _| Ok(())).expect("scans");
    assert_eq!(scan.file_len, 8 << 10, "the active segment is preallocated");
    assert!(scan.zero_tail && !scan.torn, "{scan:?}");
    assert!(scan.end_offset < scan.file_len);
    assert!(
        !std::fs::read_dir(dir.path().join("log"))
            .expect("log dir")
            .any(|entry| entry
                .expect("entry")
                .path()
                .to_string_lossy()
                .ends_with(".tmp")),
        "no temporary file is left behind"
    );

    // Reopened, the log continues inside the preallocated space, and survives another reopen.
    let mut log = LogStore::open(dir.path(), options).expect("reopens");
    assert_eq!(read_all(&mut log).await.len() as u64, next);
    append_durable(&mut log, vec![normal(2, next, batch(next, 3))]).await;
    close(log).await;
    let scan = scan_segment(active, |_, _| Ok(())).expect("scans");
    assert_eq!(scan.file_len, 8 << 10, "written into, not grown");
    let mut log = LogStore::open(dir.path(), options).expect("reopens again");
    let entries = read_all(&mut log).await;
    assert_eq!(entries.len() as u64, next + 1);
    assert_eq!(entries[next as usize].log_id, log_id(2, 1, next));
}

/// Byte range (offset, length) of the last record of `segment`.
fn last_record(segment: &Path) -> (u64, u64) {
    let mut last = None;
    scan_segment(segment, |record, _| {
        last = Some((record.offset, 24 + u64::from(record.payload_len)));
        Ok(())
    })
    .expect("scans");
    last.expect("the segment holds a record")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// A closed log of 256 KiB preallocated segments, written until one is preallocated and then
/// `extra` more entries of `events` events each: its directory, options, next index and
/// active segment.
async fn a_preallocated_log(
    events: usize,
    extra: u64,
) -> (TempDir, LogStoreOptions, u64, std::path::PathBuf) {
    let dir = TempDir::new().expect("temp dir");
    let options = prealloc_options(256 << 10);
    let mut log = LogStore::open(dir.path(), options).expect("opens");
    let mut next = 0;
    append_until_preallocated(&mut log, &mut next, events, 1, extra).await;
    close(log).await;
    let active = segment_files(dir.path()).pop().expect("a segment");
    (dir, options, next, active)
}

#[tokio::test]
async fn in_preallocated_space_a_torn_record_is_truncated_but_a_flipped_bit_is_refused() {
    // Batches of 400 events: several KiB per record, so a record spans whole sectors.
    let (dir, options, next, active) = a_preallocated_log(400, 3).await;
    let (offset, len) = last_record(&active);
    assert!(len > 2048, "records span several sectors: {len} bytes");

    // A crash that kept one sector of the last record from the disk: zeros inside the record,
    // zeros after it. Recovery drops that record, which was never acknowledged.
    let torn = TempDir::new().expect("temp dir");
    copy_dir(dir.path(), torn.path());
    let torn_segment = torn
        .path()
        .join("log")
        .join(active.file_name().expect("name"));
    let sector = (offset + 1024).div_ceil(512) * 512;
    OpenOptions::new()
        .write(true)
        .open(&torn_segment)
        .expect("open")
        .write_all_at(&[0u8; 512], sector)
        .expect("zero a sector");
    let mut log = LogStore::open(torn.path(), options).expect("a torn record is recovered");
    let entries = read_all(&mut log).await;
    assert_eq!(entries.len() as u64, next - 1);
    // The log continues where the torn record was.
    append_durable(&mut log, vec![normal(2, next - 1, batch(7, 2))]).await;
    close(log).await;
    let mut log = LogStore::open(torn.path(), options).expect("reopens");
    let entries = read_all(&mut log).await;
    assert_eq!(entries.len() as u64, next);
    assert_eq!(entries[next as usize - 1].log_id, log_id(2, 1, next - 1));
    close(log).await;

    // The common torn append: the record's last page missed the disk, and it ends less than a
    // sector past the page that made it (no whole zero sector inside it). Also recovered.
    let end = offset + len;
    assert_ne!(end % 512, 0, "the record ends inside a sector");
    let tail = TempDir::new().expect("temp dir");
    copy_dir(dir.path(), tail.path());
    let tail_segment = tail
        .path()
        .join("log")
        .join(active.file_name().expect("name"));
    let boundary = (end - 1) / 512 * 512;
    OpenOptions::new()
        .write(true)
        .open(&tail_segment)
        .expect("open")
        .write_all_at(&vec![0u8; (end - boundary) as usize], boundary)
        .expect("zero the record's last partial sector");
    let mut log = LogStore::open(tail.path(), options).expect("a torn tail sector is recovered");
    assert_eq!(read_all(&mut log).await.len() as u64, next - 1);
    close(log).await;

    // A flipped bit in a record that is all there is damage, not a torn write: refused.
    let flipped = TempDir::new().expect("temp dir");
    copy_dir(dir.path(), flipped.path());
    let flipped_segment = flipped
        .path()
        .join("log")
        .join(active.file_name().expect("name"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&flipped_segment)
        .expect("open");
    let at = offset + len - 3;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).expect("read");
    file.write_all_at(&[byte[0] ^ 0x01], at).expect("flip");
    drop(file);
    match LogStore::open(flipped.path(), options) {
        Err(RaftStoreError::CorruptRecord {
            segment,
            offset: at,
            ..
        }) => {
            assert_eq!(segment, flipped_segment);
            assert_eq!(at, offset);
        }
        Err(other) => panic!("expected a corrupt record error, got {other}"),
        Ok(_) => panic!("a flipped bit in the last record must be refused"),
    }
}

#[tokio::test]
async fn truncation_inside_a_preallocated_segment_leaves_no_stale_record_behind() {
    let dir = TempDir::new().expect("temp dir");
    let options = prealloc_options(1 << 20);
    let mut log = LogStore::open(dir.path(), options).expect("opens");
    let mut next = 0;
    append_until_preallocated(&mut log, &mut next, 2, 1, 20).await;
    // Cut the last 10 entries and write one replacement of exactly the same size: without
    // zeroing, the old record after it (the next index, a valid checksum) would read as part
    // of the log after a restart.
    let cut = next - 10;
    log.truncate(log_id(1, 1, cut)).await.expect("truncate");
    let replacement = normal(5, cut, batch(cut, 2));
    append_durable(&mut log, vec![replacement]).await;
    close(log).await;
    let mut log = LogStore::open(dir.path(), options).expect("reopens");
    let entries = read_all(&mut log).await;
    assert_eq!(
        entries.len() as u64,
        cut + 1,
        "nothing after the replacement"
    );
    assert_eq!(entries[cut as usize].log_id, log_id(5, 1, cut));
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id, Some(log_id(5, 1, cut)));
}

/// A projection that halts (as a digest mismatch does) on the batch holding marker 7.
#[derive(Clone, Debug, Default)]
struct HaltsOnSeven {
    inner: CountingProjection,
    halted: Option<String>,
}

impl gyre_log::raft::Projection for HaltsOnSeven {
    fn apply_events(&mut self, index: u64, batch: &[u8], events: Vec<Event>) -> Result<(), String> {
        let seven = events
            .iter()
            .any(|event| matches!(event.body, EventBody::EngineReady { engine } if engine.0 == 7));
        self.inner.apply_events(index, batch, events)?;
        if seven {
            self.halted = Some(format!("entry {index} does not match"));
        }
        Ok(())
    }
    fn snapshot_body(&self) -> Vec<u8> {
        self.inner.snapshot_body()
    }
    fn restore(body: &[u8]) -> Result<Self, String> {
        Ok(HaltsOnSeven {
            inner: CountingProjection::restore(body)?,
            halted: None,
        })
    }
    fn digest(&self) -> [u8; 32] {
        self.inner.digest()
    }
    fn empty() -> Self {
        HaltsOnSeven::default()
    }
    fn halted(&self) -> Option<String> {
        self.halted.clone()
    }
}

/// The entry that halts a state machine is not counted as applied, and no snapshot is built of
/// the halted state (it may hold part of that entry): a restart must stop at it again rather
/// than carry on past it from a snapshot.
#[tokio::test]
async fn a_halted_state_machine_neither_counts_the_entry_nor_snapshots_it() {
    let dir = TempDir::new().expect("temp dir");
    let (_log, mut sm) = open_storage::<HaltsOnSeven>(dir.path(), tiny_segments()).expect("opens");
    sm.apply(vec![normal(1, 1, batch(1, 2))])
        .await
        .expect("applies");
    assert!(sm.apply(vec![normal(1, 2, batch(7, 2))]).await.is_err());
    assert_eq!(
        sm.digest().0,
        Some(log_id(1, 1, 1)),
        "entry 2 is not applied"
    );
    let built = sm.get_snapshot_builder().await.build_snapshot().await;
    let error = built.expect_err("no snapshot of a halted state machine");
    assert!(
        error
            .to_string()
            .contains("no snapshot of a halted state machine"),
        "{error}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("snapshots"))
            .expect("lists")
            .count(),
        0
    );
}

/// The bytes of a whole, intact snapshot file (what a receiver accepts).
fn a_snapshot_file() -> Vec<u8> {
    let body = b"projection state";
    gyre_log::raft::snapshot::encode_snapshot(
        &gyre_log::raft::SnapshotHeader {
            last_log_id: Some(log_id(1, 1, 25)),
            last_membership: Default::default(),
            snapshot_id: "1-25-1".into(),
            body_len: body.len() as u64,
            body_crc32c: crc32c::crc32c(body),
            digest: String::new(),
        },
        body,
    )
}

/// openraft 0.9 queues the purge that follows a snapshot install without waiting for the
/// install: a purge past every stored snapshot waits while a received snapshot has not settled
/// (stored by an install, or let go), so a crash between the two cannot leave the log purged
/// past the newest snapshot on disk. A received file that was never installed is removed when
/// it is let go.
#[tokio::test]
async fn a_purge_waits_for_a_received_snapshot_to_settle() {
    use std::future::Future;
    use std::task::{Context, Poll};

    let dir = TempDir::new().expect("temp dir");
    let (mut log, sm) =
        open_storage::<CountingProjection>(dir.path(), tiny_segments()).expect("opens");
    append_durable(&mut log, sample_entries(30)).await;
    let incoming = dir.path().join("snapshots").join("incoming-test.snap");
    let received = gyre_log::raft::SnapshotFile::write_received(
        incoming.clone(),
        &a_snapshot_file(),
        &sm.install_gate(),
    )
    .expect("written");
    assert_eq!(sm.install_gate().pending(), 1);

    let mut purge = Box::pin(log.purge(log_id(1, 1, 20)));
    let waker = std::task::Waker::noop();
    assert!(
        matches!(
            purge.as_mut().poll(&mut Context::from_waker(waker)),
            Poll::Pending
        ),
        "the purge waits while the received snapshot is pending"
    );
    drop(received);
    assert_eq!(sm.install_gate().pending(), 0);
    assert!(!incoming.exists(), "a received file let go is removed");
    purge.await.expect("purges once it settled");
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 20)));

    // A purge behind a stored snapshot (the one after a build) never waits: it must not hold
    // openraft's core while an install of a received snapshot queues behind it.
    sm.install_gate().stored(Some(log_id(1, 1, 25)));
    let _received = gyre_log::raft::SnapshotFile::write_received(
        incoming,
        &a_snapshot_file(),
        &sm.install_gate(),
    )
    .expect("written");
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        log.purge(log_id(1, 1, 24)),
    )
    .await
    .expect("does not wait")
    .expect("purges");
}

/// A damaged length field that makes a record (not its segment's first) run past the end of a
/// preallocated segment is refused, naming the record: read as a cut write it would have
/// truncated the log there, dropping every committed entry after it.
#[tokio::test]
async fn a_length_running_past_a_preallocated_segment_is_refused_not_truncated() {
    let (dir, options, _, active) = a_preallocated_log(40, 6).await;
    let mut records = Vec::new();
    scan_segment(&active, |record, _| {
        records.push((record.offset, record.index, record.payload_len));
        Ok(())
    })
    .expect("scans");
    assert!(records.len() >= 3, "{records:?}");
    let (offset, index, len) = records[1];
    let file = OpenOptions::new().write(true).open(&active).expect("open");
    let damaged = len + (512 << 10);
    file.write_all_at(&damaged.to_le_bytes(), offset)
        .expect("damage the length");
    drop(file);
    let Err(error) = LogStore::open(dir.path(), options) else {
        panic!("a damaged length is refused");
    };
    let text = error.to_string();
    assert!(
        text.contains("length field is damaged") && text.contains(&format!("{offset}")),
        "{text}"
    );
    assert!(text.contains(&index.to_string()), "{text}");
}

fn archiving_segments() -> LogStoreOptions {
    LogStoreOptions {
        archive: true,
        ..tiny_segments()
    }
}

/// Every entry `archive::read_entries` finds in `dir` from `from`, as (index, term, marker of
/// the batch's first event or `None` for blank / membership entries).
fn entries_in_files(dir: &Path, from: u64, before: u64) -> Vec<(u64, u64, bool)> {
    let mut found = Vec::new();
    gyre_log::raft::archive::read_entries(dir, from, before, |entry| {
        let events = matches!(
            gyre_log::raft::record::split_payload(entry.payload),
            Ok((gyre_log::raft::record::RecordKind::Events, _, _))
        );
        found.push((entry.index, entry.term, events));
        true
    })
    .expect("the files read");
    found
}

/// With `archive`, a purge inside the log moves whole segments to `archive/` (nothing is
/// deleted), the store serves only what is behind the purge point, and the segment files
/// (archive, then live log) still hold every entry once, in order, chained; reopening ignores
/// the archive. A purge past the end of the log (a received snapshot) deletes instead.
#[tokio::test]
async fn purges_archive_committed_segments_and_the_files_keep_every_entry() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("opens");
    append_durable(&mut log, sample_entries(40)).await;
    let before = segment_files(dir.path());
    log.purge(log_id(1, 1, 20)).await.expect("purge");
    let stats = log.stats();
    assert!(stats.segments_archived > 0, "{stats:?}");
    assert_eq!(stats.segments_deleted, 0, "{stats:?}");
    let live = segment_files(dir.path());
    let archived = gyre_log::raft::archive::log_segments(dir.path())
        .expect("lists")
        .into_iter()
        .filter(|segment| segment.home == gyre_log::raft::archive::SegmentHome::Archive)
        .count();
    assert_eq!(archived + live.len(), before.len(), "moved, not deleted");
    assert_eq!(
        read_all(&mut log).await.first().map(|e| e.log_id.index),
        Some(21)
    );

    let files = entries_in_files(dir.path(), 0, 40);
    assert_eq!(
        files.iter().map(|(index, _, _)| *index).collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>(),
        "every entry once, in order"
    );
    assert!(!files[0].2 && files[1..].iter().all(|(_, _, events)| *events));
    // A range in the middle, and a reader that stops early.
    assert_eq!(entries_in_files(dir.path(), 7, 9).len(), 2);
    let mut taken = 0;
    let after = gyre_log::raft::archive::read_entries(dir.path(), 0, 40, |_| {
        taken += 1;
        taken < 5
    })
    .expect("reads");
    assert_eq!(
        (taken, after),
        (5, 4),
        "the fifth entry stopped it, not delivered"
    );
    close(log).await;

    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("reopens");
    let entries = read_all(&mut log).await;
    assert_eq!(entries.first().map(|e| e.log_id.index), Some(21));
    assert_eq!(entries.len(), 19);
    // Past the end: nothing of it is known to be committed; deleted, not archived.
    let archived_before = log.stats().segments_archived;
    log.purge(log_id(3, 1, 100))
        .await
        .expect("purge past the end");
    let stats = log.stats();
    assert_eq!(stats.segments_archived, archived_before, "{stats:?}");
    close(log).await;
}

/// With `archive_bytes_max` the archive stays within it: each purge that takes it past
/// deletes its oldest segments and counts them, and what is left (archive, then live log)
/// still reads as one verified chain from the oldest entry kept, to the end. Reopening with a
/// lower limit trims at once.
#[tokio::test]
async fn the_archive_is_kept_within_its_size_limit() {
    let dir = TempDir::new().expect("temp dir");
    let limit = 2048;
    let options = LogStoreOptions {
        archive_bytes_max: limit,
        ..archiving_segments()
    };
    let mut log = LogStore::open(dir.path(), options).expect("opens");
    append_durable(&mut log, sample_entries(120)).await;
    for upto in [20, 40, 60, 80, 100] {
        log.purge(log_id(1, 1, upto)).await.expect("purge");
        let stats = log.stats();
        assert!(
            stats.archive_bytes <= limit,
            "after purging to {upto}: {stats:?}"
        );
        let (bytes, segments) = gyre_log::raft::archive::archive_size(dir.path()).expect("sizes");
        assert_eq!(
            (bytes, segments),
            (stats.archive_bytes, stats.archive_segments),
            "the counters are the disk's"
        );
    }
    let stats = log.stats();
    assert!(stats.archive_segments_deleted > 0, "{stats:?}");
    assert!(
        stats.archive_segments > 0,
        "the newest part is kept: {stats:?}"
    );
    let files = entries_in_files(dir.path(), 0, 120);
    let first = files.first().expect("entries").0;
    assert!(first > 0, "the oldest entries are gone");
    assert_eq!(
        files.iter().map(|(index, _, _)| *index).collect::<Vec<_>>(),
        (first..120).collect::<Vec<_>>(),
        "from the oldest kept entry to the end, once each, chained"
    );
    assert!(
        first <= 101 - 16,
        "the archive keeps entries behind the live log: first {first}"
    );
    close(log).await;

    let mut lower = options;
    lower.archive_bytes_max = 1;
    let log = LogStore::open(dir.path(), lower).expect("reopens");
    let stats = log.stats();
    assert_eq!(
        (stats.archive_bytes, stats.archive_segments),
        (0, 0),
        "{stats:?}"
    );
    assert!(stats.archive_segments_deleted > 0, "{stats:?}");
    let files = entries_in_files(dir.path(), 0, 120);
    assert_eq!(
        files.last().map(|entry| entry.0),
        Some(119),
        "the live log is whole"
    );
    close(log).await;
}

/// A read of the files that the archive's size limit overtakes (the segments after the one it
/// reads are deleted meanwhile) stops with an error saying so and where the files now begin,
/// not one that reads as a damaged log.
#[tokio::test]
async fn a_read_overtaken_by_the_archive_limit_says_so() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("opens");
    append_durable(&mut log, sample_entries(80)).await;
    log.purge(log_id(1, 1, 60)).await.expect("purge");
    assert!(log.stats().archive_segments > 2, "{:?}", log.stats());
    let mut trimmed = false;
    let error = gyre_log::raft::archive::read_entries(dir.path(), 0, 80, |_| {
        if !trimmed {
            trimmed = true;
            gyre_log::raft::archive::trim_archive(dir.path(), 1).expect("trims");
        }
        true
    })
    .expect_err("the rest of the archive is gone");
    let text = error.to_string();
    assert!(
        text.contains("were deleted from the archive (its size limit) while this read ran"),
        "{text}"
    );
    assert!(
        matches!(error, gyre_log::raft::RaftStoreError::Trimmed { .. }),
        "{error:?}"
    );
    close(log).await;
}

/// A crash between a purge's meta write and its move leaves purged segments in `log/`:
/// reopening finishes the move to the archive when the live log continues their chain, and
/// deletes them when it does not (the log restarted behind a received snapshot: a detached
/// segment).
#[tokio::test]
async fn an_interrupted_archive_is_finished_when_the_log_reopens() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("opens");
    append_durable(&mut log, sample_entries(40)).await;
    log.purge(log_id(1, 1, 20)).await.expect("purge");
    close(log).await;
    // Put the archived segments back, as if the crash came before the renames.
    let archive = dir.path().join("archive");
    let moved: Vec<_> = std::fs::read_dir(&archive)
        .expect("archive")
        .map(|entry| entry.expect("entry").path())
        .collect();
    assert!(!moved.is_empty());
    for path in &moved {
        std::fs::rename(
            path,
            dir.path().join("log").join(path.file_name().expect("name")),
        )
        .expect("move back");
    }
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("reopens");
    assert_eq!(read_all(&mut log).await.len(), 19);
    for path in &moved {
        assert!(path.exists(), "{} is archived again", path.display());
    }
    assert_eq!(entries_in_files(dir.path(), 0, 40).len(), 40);

    // The log restarts past its end (as after a received snapshot): a detached segment. A
    // leftover from before it is not this log's committed past and is deleted.
    log.purge(log_id(3, 1, 100))
        .await
        .expect("purge past the end");
    append_durable(&mut log, vec![normal(3, 101, batch(101, 2))]).await;
    close(log).await;
    let stale = dir
        .path()
        .join("log")
        .join(moved[0].file_name().expect("name"));
    std::fs::copy(&moved[0], &stale).expect("a leftover");
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("reopens");
    assert!(
        !stale.exists(),
        "the leftover before a detached log is deleted"
    );
    let entries = read_all(&mut log).await;
    assert_eq!(entries.len(), 1);
    close(log).await;
    // The readers start at the detached segment: the archive before it does not chain into it.
    let files = entries_in_files(dir.path(), 0, 200);
    assert_eq!(
        files.iter().map(|(index, _, _)| *index).collect::<Vec<_>>(),
        vec![101]
    );
}

/// A flipped bit in an archived segment is refused by the readers of the files, naming the
/// segment; entries before it were delivered.
#[tokio::test]
async fn a_damaged_archived_segment_is_refused() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("opens");
    append_durable(&mut log, sample_entries(40)).await;
    log.purge(log_id(1, 1, 20)).await.expect("purge");
    close(log).await;
    let segments = gyre_log::raft::archive::log_segments(dir.path()).expect("lists");
    let victim = segments
        .iter()
        .rfind(|segment| segment.home == gyre_log::raft::archive::SegmentHome::Archive)
        .expect("an archived segment");
    let mut bytes = std::fs::read(&victim.path).expect("read");
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    std::fs::write(&victim.path, &bytes).expect("write");
    let mut delivered = Vec::new();
    let error = gyre_log::raft::archive::read_entries(dir.path(), 0, 40, |entry| {
        delivered.push(entry.index);
        true
    })
    .expect_err("a damaged record is refused");
    assert!(
        error
            .to_string()
            .contains(&victim.path.display().to_string()),
        "{error}"
    );
    assert!(
        delivered.iter().copied().eq(0..delivered.len() as u64),
        "what came before the damage was delivered, in order: {delivered:?}"
    );
    assert!(!delivered.is_empty(), "entry 0 precedes the damage");
}

/// A purge past the end of the log (a received snapshot) deletes every segment, the last one
/// too: none of it is known to be committed here, so none of it may reach the archive or the
/// readers, then or after the log goes on (a detached segment) and later purges archive.
#[tokio::test]
async fn a_purge_past_the_end_leaves_nothing_stale_to_archive_or_read() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("opens");
    append_durable(&mut log, sample_entries(40)).await;
    log.purge(log_id(1, 1, 20)).await.expect("purge inside");
    log.purge(log_id(3, 1, 100))
        .await
        .expect("purge past the end");
    assert!(
        segment_files(dir.path()).is_empty(),
        "every live segment deleted"
    );
    let served = entries_in_files(dir.path(), 0, 200);
    assert!(
        served.iter().all(|(index, _, _)| *index <= 20),
        "only what the inside purge archived: {served:?}"
    );
    // The log goes on at 101, detached; a later purge inside it archives its own segments.
    let entries: Vec<Entry> = (101..140)
        .map(|index| normal(3, index, batch(index, 3)))
        .collect();
    append_durable(&mut log, entries).await;
    log.purge(log_id(3, 1, 130))
        .await
        .expect("purge inside the new log");
    close(log).await;
    let served = entries_in_files(dir.path(), 0, 200);
    assert_eq!(
        served
            .iter()
            .map(|(index, _, _)| *index)
            .collect::<Vec<_>>(),
        (101..140).collect::<Vec<_>>(),
        "the readers start at the restart and hold nothing stale"
    );
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("reopens");
    assert_eq!(
        read_all(&mut log).await.first().map(|e| e.log_id.index),
        Some(131)
    );
    close(log).await;
}

/// A crash after a purge past the end wrote its meta file and before it deleted the segments:
/// recovery finishes it (every segment holding only purged entries goes), so nothing stale is
/// read or archived afterwards.
#[tokio::test]
async fn an_interrupted_purge_past_the_end_is_finished_when_the_log_reopens() {
    let dir = TempDir::new().expect("temp dir");
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("opens");
    append_durable(&mut log, sample_entries(40)).await;
    close(log).await;
    let saved = TempDir::new().expect("temp dir");
    copy_dir(&dir.path().join("log"), saved.path());
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("reopens");
    log.purge(log_id(3, 1, 100))
        .await
        .expect("purge past the end");
    close(log).await;
    // The segments come back, as if the deletes never happened.
    copy_dir(saved.path(), &dir.path().join("log"));
    assert!(!segment_files(dir.path()).is_empty());
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("reopens");
    assert!(
        segment_files(dir.path()).is_empty(),
        "recovery deleted them"
    );
    assert!(read_all(&mut log).await.is_empty());
    assert!(
        entries_in_files(dir.path(), 0, 200).is_empty(),
        "nothing stale is read"
    );
    append_durable(&mut log, vec![normal(3, 101, batch(101, 2))]).await;
    close(log).await;
    let mut log = LogStore::open(dir.path(), archiving_segments()).expect("reopens again");
    assert_eq!(read_all(&mut log).await.len(), 1);
    close(log).await;
}
