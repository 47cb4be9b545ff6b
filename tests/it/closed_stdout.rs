//! Commands whose reader goes away (`gyre quickstart | head -1`) end quietly with status 0, as
//! Unix tools do, instead of panicking with "failed printing to stdout" (status 101); a full
//! disk (`> /dev/full`) is an error with status 2, not a panic.

/// Runs `gyre ARGS`, reads the first bytes of its stdout, closes the pipe and returns the exit
/// code and stderr.
pub(crate) fn into_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gyre starts");
    let mut first = [0u8; 10];
    child
        .stdout
        .take()
        .expect("stdout")
        .read_exact(&mut first)
        .expect("the first bytes");
    // The read end is closed here (dropped with the `take`n handle).
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    (child.wait().expect("exit").code(), stderr)
}

#[test]
fn quickstart_and_model_bench_end_quietly_into_a_closed_pipe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("qs");
    for args in [
        vec!["quickstart", "--out", out.to_str().expect("utf-8")],
        vec!["model", "bench", "--new-tokens", "1", "--steps", "1"],
    ] {
        let (code, stderr) = into_closed_pipe(&args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        // A host without /dev/full (not Linux) has nothing to check here.
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["quickstart", "--out"])
        .arg(dir.path().join("qs"))
        .stdout(full)
        .output()
        .expect("gyre runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("writing to stdout"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `gyre log tail --follow | head` ends when its reader goes away (the leader's idle ticks give
/// it something to write); `gyre log append | head -1` stops printing but still appends every
/// line of stdin, as asked.
#[test]
fn log_tail_and_append_outlive_their_reader_as_they_should() {
    use std::io::Write;
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = crate::support::InProcessCluster::start().await;
        let addresses = cluster.addresses.join(",");
        let (code, stderr) =
            into_closed_pipe(&["log", "tail", "--cluster", &addresses, "--follow"]);
        assert_eq!(code, Some(0), "tail: {stderr}");

        let lines = 50usize;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
            .args(["log", "append", "--cluster", &addresses, "--batch", "1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("gyre starts");
        // The reader is gone before the first line is appended.
        drop(child.stdout.take());
        {
            let mut stdin = child.stdin.take().expect("stdin");
            for marker in 0..lines {
                writeln!(
                    stdin,
                    r#"{{"kind":"engine_down","engine":{marker},"reason":"m"}}"#
                )
                .expect("line");
            }
        }
        let output = child.wait_with_output().expect("append ends");
        assert_eq!(
            output.status.code(),
            Some(0),
            "append: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut client = cluster.client.clone();
        let mut stream = client
            .subscribe(
                gyre_control::Sequence {
                    index: 0,
                    position: 0,
                },
                true,
            )
            .await
            .expect("subscribes");
        let mut downs = 0;
        while let Some(entry) = stream.message().await.expect("streams") {
            let events = gyre_log::decode_batch(&entry.batch).expect("decodes");
            downs += events
                .iter()
                .filter(|event| matches!(event.body, gyre_event::EventBody::EngineDown { .. }))
                .count();
        }
        assert_eq!(downs, lines, "every line was appended");
        cluster.shutdown().await;
    });
}
