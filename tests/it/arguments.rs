//! Bad flag values are refused while the arguments are parsed (or before any work starts):
//! status 2, an error naming the flag, never a panic after a benchmark measured its anchors
//! (`--seconds -1` used to panic in `Duration::from_secs_f64`) and never a run that silently
//! does nothing (`--only bogus`).

use crate::support::gyre;

#[test]
fn bad_values_are_refused_naming_the_flag() {
    let not_a_venv = tempfile::tempdir().expect("tempdir");
    let not_a_venv = not_a_venv.path().to_str().expect("utf-8");
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "log", "--seconds", "-1"], "--seconds"),
        // Zero counts were once turned into 1 without a word.
        (&["bench", "simulate", "--repeat", "0"], "--repeat"),
        (&["bench", "model", "--steps", "0"], "--steps"),
        (&["model", "bench", "--steps", "0"], "--steps"),
        (
            &["log", "append", "--cluster", "127.0.0.1:1", "--batch", "0"],
            "--batch",
        ),
        (
            &["control", "soak", "--snapshot-every", "0"],
            "--snapshot-every",
        ),
        (
            &[
                "control",
                "run",
                "--id",
                "1",
                "--data-dir",
                "/tmp/gyre-unused",
                "--listen",
                "127.0.0.1:1",
                "--peers",
                "1=127.0.0.1:1",
                "--archive-max-size",
                "5parsecs",
            ],
            "--archive-max-size",
        ),
        (&["bench", "log", "--seconds", "nan"], "--seconds"),
        (&["bench", "log", "--seconds", "inf"], "--seconds"),
        (&["control", "bench", "--seconds", "0"], "--seconds"),
        (&["control", "bench", "--writers", "0"], "--writers"),
        (&["bench", "log", "--writers", "1,0"], "--writers"),
        (&["bench", "log", "--only", "bogus"], "--only"),
        (&["control", "bench", "--only", "writers,bogus"], "--only"),
        (&["control", "bench", "--runs", "0"], "--runs"),
        (&["control", "soak", "--seconds", "-1"], "--seconds"),
        (
            &["control", "soak", "--restart-every", "nan"],
            "--restart-every",
        ),
        (&["bench", "proxy", "--concurrency", "0"], "--concurrency"),
        (&["bench", "proxy", "--concurrency", "1,0"], "--concurrency"),
        (&["bench", "proxy", "--context-max", "0"], "--context-max"),
        (&["bench", "proxy", "--context-max", "100"], "--context-max"),
        (
            &["bench", "proxy", "--decode-ms-per-token", "-1"],
            "--decode-ms-per-token",
        ),
        (
            &["bench", "proxy", "--decode-ms-per-token", "nan"],
            "--decode-ms-per-token",
        ),
        (
            &["bench", "proxy", "--answer-tokens", "0"],
            "--answer-tokens",
        ),
        (&["bench", "proxy", "--anchors", not_a_venv], "--anchors"),
        (&["model", "bench", "--new-tokens", "0"], "--new-tokens"),
        (&["bench", "model", "--new-tokens", "0"], "--new-tokens"),
        (
            &["model", "smollm2", not_a_venv, "--new-tokens", "0"],
            "--new-tokens",
        ),
        (
            &[
                "capture",
                "replay",
                "capture.jsonl",
                "--url",
                "http://127.0.0.1:1",
                "--timeout-secs",
                "0",
            ],
            "--timeout-secs",
        ),
        (
            &["trajectory", "bench", "--tokens-max", "0"],
            "--tokens-max",
        ),
        // Below the longest row the packing figure packs: refused, not silently raised.
        (
            &["trajectory", "bench", "--tokens-max", "1000"],
            "--tokens-max",
        ),
        (
            &[
                "simulate",
                "--preset",
                "table2",
                "--training-work-ratio",
                "-1",
            ],
            "--training-work-ratio",
        ),
    ];
    for (args, flag) in cases {
        let (code, stdout, stderr) = gyre(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?} names {flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // Refused before any work: nothing measured, nothing printed.
        assert!(stdout.is_empty(), "{args:?} printed: {stdout}");
    }
}
