//! The `gyre` binary: one entry point for every operator surface.
//!
//! Each subcommand lives in `commands/<name>.rs` and owns its clap arguments; this file only
//! dispatches. Errors are reported once, here, with their full cause chain.

/// `println!` for a command's data output (`gyre replay`, `simulate`, `log tail` …): when the
/// reader has gone (`gyre replay LOG | head`), the process ends quietly with status 0 as Unix
/// tools do, instead of panicking on the broken pipe. See [`commands::write_out`].
macro_rules! outln {
    () => {
        $crate::commands::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::commands::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for a command's data output; see [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::commands::write_out(format_args!($($arg)*))
    };
}

mod commands;
mod config_file;
mod open_files;

/// mimalloc instead of glibc malloc: the proxy and the control node allocate and free
/// megabyte-sized token buffers per call, which glibc serves with fresh mmap'd pages (a page
/// fault per 4 KiB every time); mimalloc keeps and reuses them. Built with `no_thp`: with
/// transparent huge pages its purged arenas were refaulted as 2 MiB pages that the kernel
/// zeroes (46% of the proxy's CPU at 128K contexts).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{CommandFactory, Parser, Subcommand};

/// Gyre: an elastic RL framework for training xLong-horizon LLM agents.
///
/// Every fact is an event on a replicated log; the scheduler, trajectory trees and packer are
/// deterministic projections of it.
#[derive(Parser)]
#[command(name = "gyre", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start here: run the paper's scheduling table on the simulator and write a report.
    ///
    /// Needs no GPU, no network and no setup. Today this is a simulation with the real
    /// scheduler; the embedded end-to-end training run (the CPU policy, the proxy and cell
    /// workers together) replaces it once the cell workers land.
    Quickstart(commands::quickstart::QuickstartArgs),
    /// Run the real scheduler on a simulated cluster: the paper's tables, or one TOML config.
    ///
    /// Same seed, same output, byte for byte.
    Simulate(commands::simulate::SimulateArgs),
    /// Benchmarks: print measured figures beside their goals (medians of several runs).
    Bench(commands::bench::BenchArgs),
    /// Verify an event log (CRCs, hash chain, digests) and print a post-mortem.
    ///
    /// `--at INDEX` dumps the state at an entry; `--recompute` re-runs the controller at every
    /// decision point and reports the first divergence.
    Replay(commands::replay::ReplayArgs),
    /// Evidence for a reward dispute: bundle one execution's facts from a log, or verify a bundle.
    Audit(commands::audit::AuditArgs),
    /// Build trajectory trees from recorded model calls, admit trajectories, pack micro-steps.
    ///
    /// Input is JSONL on stdin, one model call per line, in call order.
    Trajectory(commands::trajectory::TrajectoryArgs),
    /// The embedded CPU policy: `model bench` figures and the SmolLM2-135M profile.
    Model(commands::model::ModelArgs),
    /// The control quorum: `init`, `run` a node, `status`, `bench` the replicated log.
    Control(commands::control::ControlArgs),
    /// Operator tools on the replicated log: `append` JSON events, `tail`, `export` to a file.
    Log(commands::log::LogArgs),
    /// The black-box model proxy: Anthropic Messages, OpenAI Chat Completions and Responses in
    /// front of token-in/token-out engines; every call's exact tokens are recorded first.
    ///
    /// Point a harness at an execution's credential (`--open N` prints them):
    /// `ANTHROPIC_BASE_URL=<anthropic_base_url>` for Claude Code, a Responses provider with
    /// `base_url=<openai_base_url>` for Codex.
    Proxy(Box<commands::proxy::ProxyArgs>),
    /// Harness traffic captured by `gyre proxy --capture FILE`: `replay` it against a proxy.
    Capture(commands::capture::CaptureArgs),
}

fn main() -> std::process::ExitCode {
    // `--config FILE` of `gyre control run` / `gyre proxy` becomes flags before clap parses.
    let argv = match config_file::expand(&Cli::command(), std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(error) => {
            eprintln!("error: {}", error_text(&error));
            return std::process::ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Quickstart(args) => commands::quickstart::run(args),
        Command::Simulate(args) => commands::simulate::run(args),
        Command::Trajectory(args) => commands::trajectory::run(args),
        Command::Model(args) => commands::model::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Replay(args) => commands::replay::run(args),
        Command::Audit(args) => commands::audit::run(args),
        Command::Control(args) => commands::control::run(args),
        Command::Log(args) => commands::log::run(args),
        Command::Proxy(args) => commands::proxy::run(*args),
        Command::Capture(args) => commands::capture::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error_text(&error));
            std::process::ExitCode::from(exit_code(&error))
        }
    }
}

/// An error with its causes, each once: a cause whose text the message already holds (an IO
/// error that names its OS error and also reports it as its source) is not repeated.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// The exit status for a command's error: 3 for a control node that halted (a supervisor must
/// not restart it blindly), 2 for everything else.
fn exit_code(error: &anyhow::Error) -> u8 {
    if error.is::<commands::control::NodeHalted>() {
        commands::control::NodeHalted::EXIT_CODE
    } else {
        2
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_the_message_already_names_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        #[derive(Debug)]
        struct Wraps(std::io::Error);
        impl std::fmt::Display for Wraps {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "x.log: open: {}", self.0)
            }
        }
        impl std::error::Error for Wraps {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = anyhow::Error::from(Wraps(io)).context("opening x.log");
        assert_eq!(
            super::error_text(&error),
            "opening x.log: x.log: open: no such file"
        );
    }

    #[test]
    fn a_halted_node_exits_3_and_any_other_error_2() {
        let halted = anyhow::Error::from(crate::commands::control::NodeHalted::new(
            2,
            "projection digest mismatch".to_string(),
        ));
        assert_eq!(super::exit_code(&halted), 3);
        assert_eq!(super::exit_code(&halted.context("serving")), 3);
        assert_eq!(
            super::exit_code(&anyhow::anyhow!("binding 0.0.0.0:7000")),
            2
        );
    }
}
