//! One module per `gyre` subcommand.

pub mod trajectory;
pub mod simulate;
pub mod quickstart;
