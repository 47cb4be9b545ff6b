//! gyre-trajectory: from recorded model calls to bounded, de-duplicated, weight-balanced
//! training data (DESIGN.md §6–§7; the paper's 轨迹树, 部分评分, 轨迹采样, 执行级目标函数).
//!
//! Architecture invariant: this crate is pure. It does no IO, reads no clock, uses no global
//! random source and no `RandomState` hash map; every output is a deterministic function of the
//! events it is given (randomness comes from [`SplitMix64`] seeded with logged values).
//!
//! Map: [`Tree`] (one per execution) is built from `ModelCallRecord`s; [`match_context`] finds
//! where a full context attaches; [`RoleClasses`] rank leaves; [`admit`] draws at most J_max
//! trajectories; [`Scoring`] is the partial-scoring state machine and [`group_advantages`] the
//! group-relative advantage; [`objective`] is the reference eq (5)–(6) loss; [`TrajectoryBuffer`],
//! [`StreamPacker`] and [`MicroStepQueue`] are the streaming-training projections;
//! [`statistics`] gives the Appendix C figures; [`synthetic`] generates seeded executions for
//! tests and benchmarks; `snapshot.rs` is the buffer's snapshot encoding
//! (`TrajectoryBuffer::encode_into` / `decode_from`).

mod admission;
mod buffer;
mod classes;
mod error;
mod matcher;
mod objective;
mod packer;
mod prng;
mod queue;
mod render;
mod scoring;
mod snapshot;
mod stats;
pub mod synthetic;
mod tree;

pub use admission::*;
pub use buffer::*;
pub use classes::*;
pub use error::*;
pub use matcher::*;
pub use objective::*;
pub use packer::*;
pub use prng::*;
pub use queue::*;
pub use render::*;
pub use scoring::*;
pub use snapshot::TRAJECTORY_FORMAT;
pub use stats::*;
pub use tree::*;
