//! One module per `gyre` subcommand.

pub mod bench;
pub mod quickstart;
pub mod simulate;
pub mod trajectory;
