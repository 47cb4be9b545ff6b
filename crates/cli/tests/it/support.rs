//! Helpers shared by the process tests: run the `gyre` binary and capture its output.

use std::process::Command;

/// Run `gyre ARGS` and return (exit code, stdout, stderr).
pub fn gyre(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .output()
        .expect("gyre runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    )
}
