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
pub(crate) mod values;

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

/// Writes a command's data output to stdout (the `outln!` / `out!` macros). A closed pipe ends
/// the process with status 0: the reader took what it wanted. Any other write error ends it
/// with status 2 and the error on stderr.
pub(crate) fn write_out(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(text).and_then(|()| {
        // Line-buffered already when a terminal; a pipe gets each line as it is printed, as
        // `println!` gave it (a `log tail` reader sees events as they commit).
        stdout.flush()
    });
    if let Err(error) = written {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {error}");
        std::process::exit(2);
    }
}
