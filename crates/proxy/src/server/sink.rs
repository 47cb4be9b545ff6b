//! Where TITO records go before the harness gets the end of its answer.
//!
//! - [`ControlSink`]: the replicated log — a `gyre_control::Producer` appending to the control
//!   quorum; `commit` returns once the record's entry is committed and folded (a projection
//!   refusal is an error: the proxy's tree and the log's would disagree).
//! - [`FileSink`]: a local event file (`gyre-log`'s CRC-framed, hash-chained format, readable by
//!   `gyre replay` and `gyre audit`) for single-machine runs and tests. One writer thread; every
//!   group of records waiting together is appended as one batch and made durable with one
//!   `fdatasync` before any of them is acknowledged.

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use gyre_event::{Event, StoredResponseRecord};
use tokio::sync::oneshot;

/// Why a batch was not committed whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitFailure {
    pub message: String,
    /// Positions of the batch's events that are in the log all the same. A quorum folds an
    /// entry's events one by one, so one refused does not undo the others (a call's record may
    /// be folded while the stored turn beside it was refused); a file's batch is written whole
    /// or not at all (none).
    pub durable: Vec<usize>,
}

impl CommitFailure {
    /// A failure that left nothing of the batch in the log.
    pub fn of(message: impl Into<String>) -> Self {
        CommitFailure {
            message: message.into(),
            durable: Vec::new(),
        }
    }
}

impl std::fmt::Display for CommitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Commits events durably.
pub trait RecordSink: Send + Sync + 'static {
    /// Resolves once `events` are durable together (committed on a quorum in one entry, or
    /// fsynced to the file in one batch): a call's record and the stored turns its answer
    /// hands over cost one commit. A failure says which events are in the log all the same
    /// ([`CommitFailure::durable`]).
    fn commit(&self, events: Vec<Event>) -> BoxFuture<'static, Result<(), CommitFailure>>;
    /// Where records go, for `/health` and logs.
    fn describe(&self) -> String;

    /// The `ResponseStored` records of `execution` the log holds, in commit order, read back
    /// for a stored response the proxy no longer holds in memory (the store is a cache of
    /// the log). `holding` is the response wanted: a replica that lags may not have it yet,
    /// and another is asked. A sink that cannot read back returns none.
    fn stored_responses(
        &self,
        execution: u64,
        holding: &str,
    ) -> BoxFuture<'static, Result<Vec<StoredResponseRecord>, String>> {
        let _ = (execution, holding);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// `execution` is closed: none of its stored responses will be asked for again, so what
    /// the sink keeps to find them can go (a long run closes an execution per rollout).
    fn forget_execution(&self, execution: u64) {
        let _ = execution;
    }
}

/// The `ResponseStored` records among `events`, in order.
fn response_records(events: Vec<Event>) -> impl Iterator<Item = StoredResponseRecord> {
    events.into_iter().filter_map(|event| match event.body {
        gyre_event::EventBody::ResponseStored(record) => Some(*record),
        _ => None,
    })
}

pub struct ControlSink {
    producer: gyre_control::Producer,
    /// For reading a record back (see [`ControlSink::already_in_log`]).
    client: gyre_control::ClusterClient,
    addresses: String,
}

impl ControlSink {
    /// Must be called inside a tokio runtime (the producer starts its connection task).
    pub fn new(addresses: &str) -> Result<ControlSink, String> {
        let client = gyre_control::ClusterClient::new(addresses).map_err(|e| e.to_string())?;
        Ok(ControlSink {
            producer: gyre_control::Producer::new(
                client.clone(),
                gyre_control::ProducerOptions::default(),
            ),
            client,
            addresses: addresses.to_string(),
        })
    }

    /// Whether `record` is in the log exactly as given. Appends are retried when a leader dies
    /// or a connection drops, so a record can be committed by an attempt whose answer was lost
    /// and then refused by the retry as already recorded: that commit is the record's, and the
    /// harness must get its answer (failing it would have the harness re-send, and the proxy
    /// sample a sibling beside a record the log already holds). A different record under the
    /// same call id is a real conflict. Each node is asked until one holds the call (the node
    /// that refused the retry holds it; another may lag). A node answers from its trajectory
    /// tree, which keeps every token, log-prob and the call's place but no times, no sampling
    /// settings, of an answer format only how many outputs it constrained (and no stop
    /// sequences for trees restored from a format-2 snapshot): those are not compared.
    async fn already_in_log(
        mut client: gyre_control::ClusterClient,
        record: &gyre_event::ModelCallRecord,
    ) -> Result<bool, String> {
        let mut last_error = None;
        for address in client.addresses().to_vec() {
            match client
                .read_execution(&address, record.execution.get())
                .await
            {
                Ok((events, _closed)) => {
                    let held = events.iter().find_map(|event| match &event.body {
                        gyre_event::EventBody::ModelCall(held) if held.call == record.call => {
                            Some(held)
                        }
                        _ => None,
                    });
                    if let Some(held) = held {
                        let mut ours = record.clone();
                        ours.requested_at = held.requested_at;
                        ours.first_token_after = held.first_token_after;
                        ours.completed_after = held.completed_after;
                        ours.stop_sequences.clone_from(&held.stop_sequences);
                        ours.sampling = held.sampling;
                        let constrained = |record: &gyre_event::ModelCallRecord| {
                            record
                                .output_constraint
                                .as_ref()
                                .map_or(0, |constraint| constraint.constrained_tokens)
                        };
                        if constrained(&ours) == constrained(held) {
                            ours.output_constraint.clone_from(&held.output_constraint);
                        }
                        return Ok(**held == ours);
                    }
                }
                Err(error) => last_error = Some(error.to_string()),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            format!(
                "no node holds call {} of execution {}",
                record.call, record.execution
            )
        }))
    }
}

impl RecordSink for ControlSink {
    fn commit(&self, events: Vec<Event>) -> BoxFuture<'static, Result<(), CommitFailure>> {
        if events.is_empty() {
            return Box::pin(async { Ok(()) });
        }
        let producer = self.producer.clone();
        let client = self.client.clone();
        Box::pin(async move {
            let records: Vec<Option<Box<gyre_event::ModelCallRecord>>> = events
                .iter()
                .map(|event| match &event.body {
                    gyre_event::EventBody::ModelCall(record) => Some(record.clone()),
                    _ => None,
                })
                .collect();
            let count = records.len();
            let (_, refused) = producer
                .append(events)
                .await
                .map_err(|error| CommitFailure::of(format!("control log: {error}")))?;
            // Each event is folded (or refused) on its own: a record the log already holds (a
            // retried commit that had landed) is no failure, any other refusal is, and the
            // events folded beside it stay in the log.
            let mut durable = Vec::with_capacity(count);
            let mut first_refusal = None;
            for (position, (reason, record)) in refused.into_iter().zip(records).enumerate() {
                if reason.is_empty() {
                    durable.push(position);
                    continue;
                }
                let refusal =
                    match record.filter(|_| gyre_trajectory::is_duplicate_call_refusal(&reason)) {
                        None => format!("control log refused the record: {reason}"),
                        Some(record) => {
                            match ControlSink::already_in_log(client.clone(), &record).await {
                                Ok(true) => {
                                    durable.push(position);
                                    continue;
                                }
                                Ok(false) => {
                                    format!(
                                    "control log refused the record: {reason} (a different record)"
                                )
                                }
                                Err(error) => format!(
                            "control log refused the record: {reason} (reading it back: {error})"
                        ),
                            }
                        }
                    };
                first_refusal.get_or_insert(refusal);
            }
            match first_refusal {
                None => Ok(()),
                Some(message) => Err(CommitFailure { message, durable }),
            }
        })
    }

    fn describe(&self) -> String {
        format!("control cluster {}", self.addresses)
    }

    /// Asks each node in turn until one's projection holds `holding` (the response was
    /// committed before its id was handed out, but a follower may not have applied it yet).
    fn stored_responses(
        &self,
        execution: u64,
        holding: &str,
    ) -> BoxFuture<'static, Result<Vec<StoredResponseRecord>, String>> {
        let mut client = self.client.clone();
        let holding = holding.to_string();
        Box::pin(async move {
            let mut last_error = None;
            for address in client.addresses().to_vec() {
                match client.read_execution_part(&address, execution, true).await {
                    Ok((events, _closed)) => {
                        let records: Vec<StoredResponseRecord> = response_records(events).collect();
                        if records.iter().any(|record| record.response_id == holding) {
                            return Ok(records);
                        }
                    }
                    Err(error) => last_error = Some(format!("{address}: {error}")),
                }
            }
            match last_error {
                Some(error) => Err(format!("reading stored responses back: {error}")),
                None => Ok(Vec::new()),
            }
        })
    }
}

struct FileJob {
    events: Vec<Event>,
    reply: oneshot::Sender<Result<(), CommitFailure>>,
}

pub struct FileSink {
    jobs: std_mpsc::Sender<FileJob>,
    path: PathBuf,
    responses: Arc<Mutex<ResponseIndex>>,
    /// Held while the file's earlier part is scanned into `responses`.
    scanning: Arc<Mutex<()>>,
}

/// Where each execution's `ResponseStored` records are in the event file: the offsets of the
/// records (batches) holding them, in file order. Records this process appends are indexed as
/// they are written; the file's earlier part only on the first read-back that needs it.
#[derive(Default)]
struct ResponseIndex {
    offsets: HashMap<u64, Vec<u64>>,
    /// The offset where this process's appends began, while the part before it is unindexed.
    unindexed_before: Option<u64>,
}

impl ResponseIndex {
    fn note(&mut self, offset: u64, events: &[Event]) {
        for event in events {
            if let gyre_event::EventBody::ResponseStored(record) = &event.body {
                let offsets = self.offsets.entry(record.execution.get()).or_default();
                if offsets.last() != Some(&offset) {
                    offsets.push(offset);
                }
            }
        }
    }

    /// The index of the file's records before `end` (a scan of that part of the file).
    fn scan(path: &Path, end: u64) -> Result<ResponseIndex, String> {
        let mut earlier = ResponseIndex::default();
        let mut reader = gyre_log::EventFileReader::open(path)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        // Stop at `end` before reading on: the record there may be an append in progress.
        while reader.offset() < end {
            let Some(record) = reader.next() else {
                break;
            };
            let record = record.map_err(|error| format!("{}: {error}", path.display()))?;
            let events = record
                .decode_events_in(path)
                .map_err(|error| error.to_string())?;
            earlier.note(record.offset, &events);
        }
        Ok(earlier)
    }

    /// Puts `earlier` (what [`ResponseIndex::scan`] found before this process's appends)
    /// in front of what this process indexed.
    fn prepend(&mut self, mut earlier: ResponseIndex) {
        for (execution, mut later) in std::mem::take(&mut self.offsets) {
            earlier
                .offsets
                .entry(execution)
                .or_default()
                .append(&mut later);
        }
        self.offsets = earlier.offsets;
        self.unindexed_before = None;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FileSink {
    /// Creates `path` (or appends to it after recovering a torn tail) and starts the writer.
    pub fn open(path: &Path) -> Result<FileSink, String> {
        let mut index = ResponseIndex::default();
        let mut writer = if path.exists() {
            let (writer, recovered) = gyre_log::EventFileWriter::open_append(path)
                .map_err(|error| format!("{}: {error}", path.display()))?;
            tracing::info!(?recovered, path = %path.display(), "appending to an existing event file");
            let end = std::fs::metadata(path)
                .map_err(|error| format!("{}: {error}", path.display()))?
                .len();
            index.unindexed_before = Some(end);
            writer
        } else {
            gyre_log::EventFileWriter::create(path)
                .map_err(|error| format!("{}: {error}", path.display()))?
        };
        let responses = Arc::new(Mutex::new(index));
        let indexed = responses.clone();
        let (jobs, queue) = std_mpsc::channel::<FileJob>();
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("gyre-proxy-log".into())
            .spawn(move || {
                while let Ok(first) = queue.recv() {
                    // One write and one `fdatasync` for everything queued meanwhile; the
                    // events move into the batch (a first call's record holds its whole
                    // prompt), the replies wait for the sync.
                    let mut events = Vec::new();
                    let mut replies = Vec::new();
                    for job in
                        std::iter::once(first).chain(std::iter::from_fn(|| queue.try_recv().ok()))
                    {
                        events.extend(job.events);
                        replies.push(job.reply);
                    }
                    let result = writer
                        .append_batch(&events)
                        .and_then(|appended| writer.sync().map(|()| appended))
                        .map(|appended| {
                            lock(&indexed).note(appended.offset, &events);
                        })
                        .map_err(|error| CommitFailure::of(format!("{shown}: {error}")));
                    for reply in replies {
                        let _ = reply.send(result.clone());
                    }
                }
            })
            .map_err(|error| format!("starting the log writer: {error}"))?;
        Ok(FileSink {
            jobs,
            path: path.to_path_buf(),
            responses,
            scanning: Arc::new(Mutex::new(())),
        })
    }
}

impl RecordSink for FileSink {
    fn commit(&self, events: Vec<Event>) -> BoxFuture<'static, Result<(), CommitFailure>> {
        if events.is_empty() {
            return Box::pin(async { Ok(()) });
        }
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send(FileJob { events, reply });
        Box::pin(async move {
            sent.map_err(|_| CommitFailure::of("the log writer stopped"))?;
            answer
                .await
                .map_err(|_| CommitFailure::of("the log writer stopped"))?
        })
    }

    fn describe(&self) -> String {
        format!("event file {}", self.path.display())
    }

    fn forget_execution(&self, execution: u64) {
        lock(&self.responses).offsets.remove(&execution);
    }

    /// Reads the indexed records back (on the blocking pool: a first read-back after a
    /// restart scans the file's earlier part).
    fn stored_responses(
        &self,
        execution: u64,
        _holding: &str,
    ) -> BoxFuture<'static, Result<Vec<StoredResponseRecord>, String>> {
        let (path, index) = (self.path.clone(), self.responses.clone());
        let scanning = self.scanning.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                {
                    // One scan at a time, without holding the index: the writer thread notes
                    // each append in it meanwhile.
                    let _scanning = lock(&scanning);
                    let unindexed_before = lock(&index).unindexed_before;
                    if let Some(end) = unindexed_before {
                        let earlier = ResponseIndex::scan(&path, end)?;
                        lock(&index).prepend(earlier);
                    }
                }
                let offsets = lock(&index)
                    .offsets
                    .get(&execution)
                    .cloned()
                    .unwrap_or_default();
                let mut records = Vec::new();
                for offset in offsets {
                    let events = gyre_log::EventFileReader::events_at(&path, offset)
                        .map_err(|error| error.to_string())?;
                    records.extend(
                        response_records(events)
                            .filter(|record| record.execution.get() == execution),
                    );
                }
                Ok(records)
            })
            .await
            .map_err(|error| format!("reading stored responses back: {error}"))?
        })
    }
}

#[cfg(test)]
mod tests {
    use gyre_event::{EventBody, ExecutionId, StoredResponseRecord, Timestamp};

    use super::*;

    #[tokio::test]
    async fn a_closed_executions_stored_responses_are_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FileSink::open(&dir.path().join("events.log")).expect("sink");
        for execution in [5, 6] {
            let record = StoredResponseRecord {
                execution: ExecutionId(execution),
                response_id: format!("resp_{execution}"),
                previous_response_id: None,
                items: b"{\"role\":\"user\",\"content\":\"hi\"}".to_vec(),
            };
            sink.commit(vec![Event::new(
                Timestamp::ZERO,
                EventBody::ResponseStored(Box::new(record)),
            )])
            .await
            .expect("committed");
        }
        let read = |execution: u64| sink.stored_responses(execution, "");
        assert_eq!(read(5).await.expect("read").len(), 1);
        sink.forget_execution(5);
        assert!(read(5).await.expect("read").is_empty(), "forgotten");
        assert_eq!(read(6).await.expect("read").len(), 1, "others kept");
    }
}
