//! One module per `gyre` subcommand.

pub mod audit;
pub mod bench;
pub mod capture;
pub mod control;
pub mod log;
pub mod model;
pub mod pipeline;
pub mod proxy;
pub mod proxy_bench;
pub mod quickstart;
pub mod replay;
pub mod simulate;
pub mod trajectory;
