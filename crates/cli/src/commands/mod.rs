//! One module per `gyre` subcommand.

pub mod audit;
pub mod bench;
pub mod model;
pub mod quickstart;
pub mod simulate;
pub mod trajectory;
pub mod replay;
