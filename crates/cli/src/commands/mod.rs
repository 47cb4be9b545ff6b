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

/// Sends `tracing` events to stderr for a long-running command: `RUST_LOG` if set, else
/// `default` (an `EnvFilter` directive such as `warn,gyre_proxy=info`).
pub(crate) fn log_to_stderr(default: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
