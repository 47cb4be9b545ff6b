//! Opening a node's storage and starting its `Raft`, the restart-safe way.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::RaftNetworkFactory;

use super::error::RaftStoreError;
use super::log_store::{LogStore, LogStoreHandle, LogStoreOptions};
use super::state_machine::{Projection, StateMachineStore};
use super::types::{NodeId, Raft, TypeConfig};

/// Opens the log store and the state machine of the node whose data lives in `dir`
/// (`<dir>/meta`, `<dir>/log/`, `<dir>/snapshots/`). The projection is already restored from
/// the newest good snapshot, which is what `Raft::new` needs after the log was purged.
pub fn open_storage<P: Projection>(
    dir: impl AsRef<Path>,
    options: LogStoreOptions,
) -> Result<(LogStore, StateMachineStore<P>), RaftStoreError> {
    let dir = dir.as_ref();
    let mut log_store = LogStore::open(dir, options)?;
    let state_machine = StateMachineStore::<P>::open(dir)?;
    log_store.wait_for_installs(state_machine.install_gate());
    Ok((log_store, state_machine))
}

/// A running node: its `Raft`, its projection, and its log's counters.
pub struct RaftNode<P> {
    pub id: NodeId,
    pub dir: PathBuf,
    pub raft: Raft,
    pub state_machine: StateMachineStore<P>,
    pub log: LogStoreHandle,
}

/// Opens the storage in `dir` and starts a `Raft` on it. A fresh directory starts an
/// uninitialised node (call `raft.initialize` on one node of a new cluster); a used one
/// resumes from its snapshot and log.
pub async fn start_node<P, N>(
    id: NodeId,
    dir: impl AsRef<Path>,
    config: Arc<openraft::Config>,
    network: N,
    options: LogStoreOptions,
) -> Result<RaftNode<P>, RaftStoreError>
where
    P: Projection,
    N: RaftNetworkFactory<TypeConfig>,
{
    let dir = dir.as_ref().to_path_buf();
    let (log_store, state_machine) = open_storage::<P>(&dir, options)?;
    let log = log_store.handle();
    let raft = Raft::new(id, config, network, log_store, state_machine.clone())
        .await
        .map_err(|fatal| RaftStoreError::Raft {
            detail: format!("node {id} did not start: {fatal}"),
        })?;
    Ok(RaftNode {
        id,
        dir,
        raft,
        state_machine,
        log,
    })
}

impl<P: Projection> RaftNode<P> {
    /// Stops the node and waits until its log writer has flushed and exited, so the directory
    /// can be reopened at once.
    pub async fn shutdown(self) -> Result<(), RaftStoreError> {
        let result = self.raft.shutdown().await;
        drop(self.raft);
        self.log.writer_exited().await;
        result.map_err(|join| RaftStoreError::Raft {
            detail: format!("node {} did not shut down cleanly: {join}", self.id),
        })
    }
}
