//! One module per `gyre` subcommand.

pub mod quickstart;
pub mod simulate;
pub mod trajectory;
