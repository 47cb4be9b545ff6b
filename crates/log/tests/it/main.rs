//! gyre-log's one integration-test binary (STYLE.md rule 15).

mod codec;
mod file;
mod fixtures;
mod golden;
mod properties;
mod raft_cluster;
mod raft_store;
mod raft_support;
mod strategies;
mod upcast;
