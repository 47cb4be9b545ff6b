//! `gyre trajectory`: placeholder until the trajectory processor lands.

use clap::Args;

/// Arguments of `gyre trajectory`.
#[derive(Args)]
pub struct TrajectoryArgs {}

pub fn run(_args: TrajectoryArgs) -> anyhow::Result<()> {
    anyhow::bail!("gyre trajectory is not built yet")
}
