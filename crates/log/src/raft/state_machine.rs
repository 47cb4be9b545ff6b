//! `StateMachineStore<P>`: openraft's `RaftStateMachine` as a fold of committed entries into a
//! [`Projection`], with snapshots as files.
//!
//! The state machine is not persisted on `apply`; snapshots are. On restart the projection is
//! restored from the newest good snapshot before `Raft::new`, and openraft re-applies the log
//! suffix up to the persisted committed id (`LogStore::save_committed`), then the rest as the
//! leader commits it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder};

use super::error::RaftStoreError;
use super::snapshot::{
    decode_snapshot, encode_snapshot_head, InstallGate, SnapshotDir, SnapshotFile, SnapshotHeader,
};
use super::types::{
    Applied, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use super::writer::lock;
use crate::file::hex;

/// A deterministic fold of committed events: what the log is for.
pub trait Projection: Send + Sync + 'static {
    /// Fold one committed entry's events (already decoded from `batch`, the entry's encoded
    /// `EventBatch`, handed over too so a projection can keep it without re-encoding) at `index`.
    fn apply_events(
        &mut self,
        index: u64,
        batch: &[u8],
        events: Vec<gyre_event::Event>,
    ) -> Result<(), String>;
    /// The projection's state as bytes for a snapshot file body, and back.
    fn snapshot_body(&self) -> Vec<u8>;
    fn restore(body: &[u8]) -> Result<Self, String>
    where
        Self: Sized;
    fn digest(&self) -> [u8; 32];
    fn empty() -> Self
    where
        Self: Sized;
    /// Why this replica must stop (for example a `ProjectionDigest` that does not match what it
    /// computed). Checked after every applied batch; `Some` fails the state machine, which stops
    /// the Raft node: a diverged replica must not keep serving.
    fn halted(&self) -> Option<String> {
        None
    }
}

struct State<P> {
    projection: P,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
}

struct Inner<P> {
    state: Mutex<State<P>>,
    snapshots: Mutex<SnapshotDir>,
    /// Received snapshots not yet settled; the log store's purge waits on it.
    install_gate: Arc<InstallGate>,
}

/// The state machine of one node; cheap to clone (clones share the state), so the node can keep
/// one to read the projection after handing one to `Raft::new`.
pub struct StateMachineStore<P> {
    inner: Arc<Inner<P>>,
}

impl<P> Clone for StateMachineStore<P> {
    fn clone(&self) -> Self {
        StateMachineStore {
            inner: self.inner.clone(),
        }
    }
}

/// Builds a snapshot of the state as it is when `build_snapshot` starts.
pub struct SnapshotBuilder<P> {
    inner: Arc<Inner<P>>,
}

impl<P: Projection> StateMachineStore<P> {
    /// Opens the snapshot directory `<dir>/snapshots` and restores the projection from the
    /// newest snapshot that reads back intact (header and body checksums, and the restored
    /// digest equal to the recorded one). With no snapshot the projection starts empty.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, RaftStoreError> {
        let (mut snapshots, newest_first) = SnapshotDir::open(dir.as_ref().join("snapshots"))?;
        let mut state = State {
            projection: P::empty(),
            last_applied: None,
            last_membership: StoredMembership::default(),
        };
        let mut failures = Vec::new();
        // The one holding the most of the log first (a file number says only which was
        // written last); one whose header does not read goes last, to be reported.
        let mut candidates: Vec<(Option<LogId>, &std::path::PathBuf)> = newest_first
            .iter()
            .map(|path| {
                let last = std::fs::read(path).ok().and_then(|bytes| {
                    decode_snapshot(path, &bytes)
                        .ok()
                        .map(|(header, _)| header.last_log_id)
                });
                (last.flatten(), path)
            })
            .collect();
        // Stable: among equals the newer file stays first.
        candidates.sort_by_key(|candidate| std::cmp::Reverse(candidate.0));
        for (_, path) in candidates {
            match load_snapshot::<P>(path) {
                Ok((header, projection)) => {
                    tracing::info!(
                        snapshot = %path.display(),
                        last_log_id = ?header.last_log_id,
                        "restored projection from snapshot"
                    );
                    state = State {
                        projection,
                        last_applied: header.last_log_id,
                        last_membership: header.last_membership.clone(),
                    };
                    snapshots.current = Some((header.meta(), path.to_path_buf()));
                    break;
                }
                Err(error) => {
                    tracing::warn!(error = %error, "snapshot unusable, trying an older one");
                    failures.push(error.to_string());
                }
            }
        }
        if snapshots.current.is_none() && !failures.is_empty() {
            return Err(RaftStoreError::BadSnapshot {
                path: snapshots.dir.clone(),
                detail: format!("no snapshot is usable: {}", failures.join("; ")),
            });
        }
        let install_gate = InstallGate::new();
        install_gate.stored(
            snapshots
                .current
                .as_ref()
                .and_then(|(meta, _)| meta.last_log_id),
        );
        Ok(StateMachineStore {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                snapshots: Mutex::new(snapshots),
                install_gate,
            }),
        })
    }

    /// The gate of the snapshots this node received and has not settled: hand it to the log
    /// store ([`LogStore::wait_for_installs`], as `open_storage` does) and to whatever writes
    /// received snapshot files ([`SnapshotFile::write_received`]).
    ///
    /// [`LogStore::wait_for_installs`]: super::LogStore::wait_for_installs
    pub fn install_gate(&self) -> Arc<InstallGate> {
        self.inner.install_gate.clone()
    }

    /// Runs `read` on the projection and the last applied log id.
    pub fn with_projection<R>(&self, read: impl FnOnce(&P, Option<LogId>) -> R) -> R {
        let state = lock(&self.inner.state);
        read(&state.projection, state.last_applied)
    }

    /// The last applied log id and the projection's digest at it.
    pub fn digest(&self) -> (Option<LogId>, [u8; 32]) {
        self.with_projection(|projection, last_applied| (last_applied, projection.digest()))
    }

    #[allow(clippy::result_large_err)] // openraft's `StorageError`, as its traits return it
    fn apply_entry(state: &mut State<P>, entry: Entry) -> Result<Applied, StorageError> {
        let log_id = entry.log_id;
        let index = log_id.index;
        // `last_applied` moves only once the entry is applied: a snapshot built meanwhile must
        // never claim an entry that halted the state machine.
        let applied = match entry.payload {
            EntryPayload::Blank => Applied {
                index,
                events: 0,
                rejected: None,
            },
            EntryPayload::Membership(membership) => {
                state.last_membership = StoredMembership::new(Some(log_id), membership);
                Applied {
                    index,
                    events: 0,
                    rejected: None,
                }
            }
            EntryPayload::Normal(batch) => {
                // A batch that does not decode was committed by a quorum, so every replica
                // holds it: stop rather than diverge from a future fixed build.
                let events = crate::codec::decode_batch_shared(&batch.0).map_err(|source| {
                    RaftStoreError::Decode { index, source }
                        .into_storage(ErrorSubject::Apply(log_id), ErrorVerb::Read)
                })?;
                let count = u32::try_from(events.len()).unwrap_or(u32::MAX);
                let outcome = state.projection.apply_events(index, &batch.0, events);
                if let Some(detail) = state.projection.halted() {
                    tracing::error!(index, detail = %detail, "projection halted the state machine");
                    return Err(RaftStoreError::BadEntry { index, detail }
                        .into_storage(ErrorSubject::Apply(log_id), ErrorVerb::Read));
                }
                let rejected = match outcome {
                    Ok(()) => None,
                    Err(detail) => {
                        tracing::warn!(index, detail = %detail, "projection rejected a committed batch");
                        Some(detail)
                    }
                };
                Applied {
                    index,
                    events: count,
                    rejected,
                }
            }
        };
        state.last_applied = Some(log_id);
        Ok(applied)
    }
}

fn load_snapshot<P: Projection>(path: &Path) -> Result<(SnapshotHeader, P), RaftStoreError> {
    let bytes = std::fs::read(path).map_err(RaftStoreError::io(path, "read snapshot"))?;
    let (header, body) = decode_snapshot(path, &bytes)?;
    let projection = restore_checked::<P>(path, &header, body)?;
    Ok((header, projection))
}

fn restore_checked<P: Projection>(
    path: &Path,
    header: &SnapshotHeader,
    body: &[u8],
) -> Result<P, RaftStoreError> {
    let projection = P::restore(body).map_err(|detail| RaftStoreError::BadSnapshot {
        path: path.to_path_buf(),
        detail: format!("projection does not restore: {detail}"),
    })?;
    let digest = hex(&projection.digest());
    if digest != header.digest {
        return Err(RaftStoreError::BadSnapshot {
            path: path.to_path_buf(),
            detail: format!(
                "restored projection digest {digest} differs from the recorded {}",
                header.digest
            ),
        });
    }
    Ok(projection)
}

fn snapshot_error(error: RaftStoreError, verb: ErrorVerb) -> StorageError {
    error.into_storage(ErrorSubject::Snapshot(None), verb)
}

impl<P: Projection> RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder<P> {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (body, digest, last_log_id, last_membership) = {
            let state = lock(&self.inner.state);
            if let Some(detail) = state.projection.halted() {
                // A halted projection may hold part of the entry that stopped it; a snapshot
                // of it would let a restart carry on past that entry.
                return Err(snapshot_error(
                    RaftStoreError::BadEntry {
                        index: state.last_applied.map_or(0, |id| id.index + 1),
                        detail: format!("no snapshot of a halted state machine: {detail}"),
                    },
                    ErrorVerb::Write,
                ));
            }
            (
                state.projection.snapshot_body(),
                state.projection.digest(),
                state.last_applied,
                state.last_membership.clone(),
            )
        };
        let inner = self.inner.clone();
        let build = move || -> Result<Snapshot, RaftStoreError> {
            let mut snapshots = lock(&inner.snapshots);
            let header = SnapshotHeader {
                last_log_id,
                last_membership,
                snapshot_id: snapshots.next_snapshot_id(last_log_id),
                body_len: body.len() as u64,
                body_crc32c: crc32c::crc32c(&body),
                digest: hex(&digest),
            };
            // Written as head then body: the body is not copied into a second buffer.
            let head = encode_snapshot_head(&header);
            let meta = header.meta();
            let (meta, path) = snapshots.store_built(meta, &[&head, &body])?;
            inner.install_gate.stored(meta.last_log_id);
            tracing::info!(snapshot = %path.display(), last_log_id = ?meta.last_log_id, "built snapshot");
            Ok(Snapshot {
                meta,
                snapshot: Box::new(SnapshotFile::at(path)),
            })
        };
        tokio::task::spawn_blocking(build)
            .await
            .map_err(|join| {
                snapshot_error(
                    RaftStoreError::Raft {
                        detail: format!("snapshot writer task failed: {join}"),
                    },
                    ErrorVerb::Write,
                )
            })?
            .map_err(|error| snapshot_error(error, ErrorVerb::Write))
    }
}

impl<P: Projection> RaftStateMachine<TypeConfig> for StateMachineStore<P> {
    type SnapshotBuilder = SnapshotBuilder<P>;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let state = lock(&self.inner.state);
        Ok((state.last_applied, state.last_membership.clone()))
    }

    /// Returns exactly one `Applied` per entry, blank and membership entries included
    /// (openraft 0.9 pairs responses with entries and panics on a short list).
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut state = lock(&self.inner.state);
        let mut applied = Vec::new();
        for entry in entries {
            applied.push(Self::apply_entry(&mut state, entry)?);
        }
        Ok(applied)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            inner: self.inner.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        let path = lock(&self.inner.snapshots).incoming_path();
        Ok(Box::new(SnapshotFile::received(
            path,
            &self.inner.install_gate,
        )))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError> {
        let install = || -> Result<(), RaftStoreError> {
            let bytes = snapshot.read_bytes()?;
            let (header, body) = decode_snapshot(&snapshot.path, &bytes)?;
            if header.meta() != *meta {
                return Err(RaftStoreError::BadSnapshot {
                    path: snapshot.path.clone(),
                    detail: format!(
                        "file holds snapshot {:?}, openraft is installing {:?}",
                        header.meta(),
                        meta
                    ),
                });
            }
            let projection = restore_checked::<P>(&snapshot.path, &header, body)?;
            {
                let mut snapshots = lock(&self.inner.snapshots);
                let own_incoming = snapshot.path.parent() == Some(snapshots.dir.as_path())
                    && snapshot
                        .path
                        .file_name()
                        .is_some_and(|name| name.to_string_lossy().starts_with("incoming-"));
                if own_incoming {
                    // Received durably into this directory: renamed into place, not rewritten.
                    snapshots.store_received(meta.clone(), &snapshot.path)?;
                } else {
                    snapshots.store(meta.clone(), &[&bytes])?;
                }
            }
            drop(bytes);
            self.inner.install_gate.stored(meta.last_log_id);
            let mut state = lock(&self.inner.state);
            state.projection = projection;
            state.last_applied = meta.last_log_id;
            state.last_membership = meta.last_membership.clone();
            Ok(())
        };
        install().map_err(|error| snapshot_error(error, ErrorVerb::Write))?;
        tracing::info!(last_log_id = ?meta.last_log_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        Ok(lock(&self.inner.snapshots)
            .current
            .as_ref()
            .map(|(meta, path)| Snapshot {
                meta: meta.clone(),
                snapshot: Box::new(SnapshotFile::at(path.clone())),
            }))
    }
}
