//! `deploy/`: every TOML config there is a valid config of its command (checked by the binary
//! itself, `--config FILE --check`), bad configs get errors naming the field, and the local
//! quorum script starts three nodes and the proxy, records a call, and restarts on its data.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{gyre, http};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn toml_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("deploy/ is readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            toml_files(&path, found);
        } else if path
            .extension()
            .is_some_and(|extension| extension == "toml")
        {
            found.push(path);
        }
    }
}

#[test]
fn every_deploy_config_checks() {
    let mut files = Vec::new();
    toml_files(&deploy_dir(), &mut files);
    files.sort();
    assert!(files.len() >= 8, "deploy/ configs: {files:?}");
    let test_model = gyre_proxy::test_model::directory();
    let scratch = tempfile::tempdir().unwrap();
    let admin_token = scratch.path().join("admin-token");
    std::fs::write(&admin_token, "a-test-token\n").unwrap();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        let path = file.to_string_lossy().into_owned();
        let mut args: Vec<String> = if name.starts_with("control") {
            vec!["control".into(), "run".into()]
        } else if name.starts_with("proxy") {
            vec!["proxy".into()]
        } else {
            panic!("{path}: a deploy config is named control*.toml or proxy*.toml");
        };
        args.extend(["--config".into(), path.clone(), "--check".into()]);
        // Kubernetes pods pass their id on the command line.
        if name.starts_with("control") && !text.lines().any(|line| line.starts_with("id =")) {
            args.extend(["--id".into(), "2".into()]);
        }
        // Production model directories and admin token files do not exist here; the command
        // line replaces them.
        if name.starts_with("proxy") {
            args.extend([
                "--model-dir".into(),
                test_model.to_string_lossy().into_owned(),
                "--admin-token-file".into(),
                admin_token.to_string_lossy().into_owned(),
            ]);
            // A proxy that listens beyond loopback guards its admin routes.
            let table: toml::Table = text.parse().unwrap();
            let listen = table.get("listen").and_then(toml::Value::as_str);
            if !listen.is_some_and(|listen| listen.starts_with("127.")) {
                assert!(
                    table.contains_key("admin_token_file"),
                    "{path} listens on {listen:?} without admin_token_file"
                );
            }
        }
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, stderr) = gyre(&words);
        assert_eq!(code, 0, "{path}: {stderr}");
        let settings: serde_json::Value =
            serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("{path}: {stdout}"));
        if name.starts_with("proxy") {
            assert!(
                settings["cluster"].is_string(),
                "{path} records to a quorum"
            );
        } else {
            assert_eq!(settings["peers"].as_object().unwrap().len(), 3, "{path}");
        }
    }
}

#[test]
fn config_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let base =
        "id = 1\ndata_dir = \"d\"\nlisten = \"127.0.0.1:7001\"\npeers = \"1=127.0.0.1:7001\"\n";
    let cases = [
        (
            format!("{base}lisen = 3\n"),
            "unknown field `lisen`; the fields of `run` are: id, data_dir, listen, peers, snapshot_every",
        ),
        (
            base.replace("127.0.0.1:7001\"\npeers", "localhost\"\npeers"),
            "field `listen`: invalid value 'localhost': invalid socket address syntax",
        ),
        (
            base.replace("id = 1", "id = \"one\""),
            "field `id`: expected an integer, found string",
        ),
        (
            base.replace("peers = \"1=127.0.0.1:7001\"", "peers = \"2=127.0.0.1:7001\""),
            "field `peers` does not list this node (field `id` = 1)",
        ),
        (
            format!("{base}heartbeat_ms = 500\n"),
            "field `election_timeout_min_ms` (600) must be at least 3 heartbeats",
        ),
        (format!("{base}[x\n"), "TOML parse error at line 5"),
    ];
    for (index, (text, expected)) in cases.iter().enumerate() {
        let path = write(&format!("case-{index}.toml"), text);
        let (code, _, stderr) = gyre(&["control", "run", "--config", &path, "--check"]);
        assert_eq!(code, 2, "{text}: {stderr}");
        assert!(
            stderr.contains(expected)
                && stderr.contains(if index < 3 || index == 5 {
                    path.as_str()
                } else {
                    "field"
                }),
            "{text}\nexpected {expected:?} in:\n{stderr}"
        );
    }
    // A flag on the command line replaces the file's value.
    let path = write("good.toml", base);
    let (code, stdout, stderr) = gyre(&[
        "control",
        "run",
        "--config",
        &path,
        "--check",
        "--snapshot-every",
        "7",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let settings: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(settings["snapshot_every"], 7);
    assert_eq!(settings["listen"], "127.0.0.1:7001");
}

/// A `GYRE_PORT_BASE` for `quorum.sh` whose four ports (base+1..3, base+10) are free now, so
/// the test neither collides with another run on this machine nor with nodes a killed run left.
fn free_port_base() -> u16 {
    // Blocks of 100 from 20000 to 59900, starting at one the process id picks.
    let first = std::process::id() % 400;
    (0..400u32)
        .map(|step| 20_000 + ((first + step) % 400) as u16 * 100)
        .find(|base| {
            [1, 2, 3, 10]
                .iter()
                .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok())
        })
        .expect("a free block of ports")
}

fn script(dir: &Path, base: u16, args: &[&str]) -> (bool, String) {
    let output = Command::new("bash")
        .arg(deploy_dir().join("local/quorum.sh"))
        .args(args)
        .arg(dir)
        .env("GYRE", env!("CARGO_BIN_EXE_gyre"))
        .env("GYRE_PORT_BASE", base.to_string())
        .output()
        .expect("bash runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Stops whatever the script started, even when the test fails half-way.
struct StopOnDrop(PathBuf, u16);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = script(&self.0, self.1, &["stop"]);
    }
}

#[test]
fn local_quorum_script_records_a_call_and_restarts_on_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let base = free_port_base();
    let _stop = StopOnDrop(run.clone(), base);
    let cluster = format!(
        "127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        base + 1,
        base + 2,
        base + 3
    );
    let cluster = cluster.as_str();

    let (ok, text) = script(&run, base, &["start"]);
    assert!(ok, "{text}");
    assert!(text.contains("cluster initialised: 3 voters"), "{text}");
    let (ok, text) = script(&run, base, &["start"]);
    assert!(!ok && text.contains("already running"), "{text}");

    let (ok, text) = script(&run, base, &["proxy"]);
    assert!(ok, "{text}");
    let opened: serde_json::Value = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .find(|value: &serde_json::Value| value.get("token").is_some())
        .unwrap_or_else(|| panic!("an execution line: {text}"));
    let token = opened["token"].as_str().unwrap();
    let (status, body) = http(
        &format!("127.0.0.1:{}", base + 10),
        "POST",
        "/v1/messages",
        &[("x-api-key", token), ("content-type", "application/json")],
        r#"{"model":"policy","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"stop_reason\""), "{body}");

    let model_calls = || {
        let (code, stdout, stderr) = gyre(&["log", "tail", "--cluster", cluster, "--from", "0"]);
        assert_eq!(code, 0, "{stderr}");
        stdout
            .lines()
            .filter(|line| line.contains("\"kind\":\"model_call\""))
            .count()
    };
    assert_eq!(model_calls(), 1);

    // Stop everything, start again on the same data: the cluster is formed already and the
    // record is still there.
    let (ok, text) = script(&run, base, &["stop"]);
    assert!(ok, "{text}");
    let (ok, text) = script(&run, base, &["start"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("cluster already initialised: 3 voters"),
        "{text}"
    );
    assert_eq!(model_calls(), 1);
}

/// `gyre proxy --check` reads an existing credential file back and names a bad line.
#[test]
fn proxy_check_reads_the_credential_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let credentials = dir.path().join("proxy.credentials");
    let log = dir.path().join("tito.log");
    let args = |credentials: &std::path::Path| {
        vec![
            "proxy".to_string(),
            "--engine".into(),
            "deterministic".into(),
            "--log".into(),
            log.display().to_string(),
            "--credentials".into(),
            credentials.display().to_string(),
            "--check".into(),
        ]
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::support::gyre(&args)
    };
    let (code, stdout, stderr) = run(args(&credentials));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\"credentials_issued\":null"), "{stdout}");
    std::fs::write(
        &credentials,
        format!(
            "{{\"open\":{{\"token_sha256\":\"{}\",\"execution\":4,\"engine\":0}}}}\n{{\"close\":{{}}}}\n",
            "ab".repeat(32)
        ),
    )
    .expect("write");
    let (code, _, stderr) = run(args(&credentials));
    assert_ne!(code, 0);
    assert!(
        stderr.contains("field `credentials`") && stderr.contains("line 2"),
        "{stderr}"
    );
}

/// `--execution-stride` / `--execution-offset` (also TOML keys) are checked and shown by
/// `--check`; an offset outside the stride is refused naming both fields.
#[test]
fn proxy_execution_numbering_is_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("tito.log");
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "engine = \"deterministic\"\nlog = \"{}\"\nexecution_stride = 4\nexecution_offset = 3\n",
            log.display()
        ),
    )
    .expect("write");
    let config = config.to_str().expect("utf-8");
    let (code, stdout, stderr) = crate::support::gyre(&["proxy", "--config", config, "--check"]);
    assert_eq!(code, 0, "{stderr}");
    let settings: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(
        (&settings["execution_stride"], &settings["execution_offset"]),
        (&serde_json::json!(4), &serde_json::json!(3))
    );
    let (code, _, stderr) = crate::support::gyre(&[
        "proxy",
        "--config",
        config,
        "--execution-offset",
        "4",
        "--check",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("field `execution_offset` (4) must be below `execution_stride` (4)"),
        "{stderr}"
    );
}

/// `--check` (systemd's `ExecStartPre`) catches what would stop the start: an admin token file
/// that cannot be read, and a log or capture file whose directory does not exist.
#[test]
fn proxy_check_catches_what_would_stop_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("tito.log");
    let log = log.to_str().expect("utf-8");
    let missing = dir.path().join("missing");
    let missing = missing.to_str().expect("utf-8");
    let in_missing = format!("{missing}/tito.log");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--log", log, "--admin-token-file", missing],
            "field `admin_token_file`: reading",
        ),
        (&["--log", &in_missing], "field `log`: the directory"),
        (
            &["--log", log, "--capture", &in_missing],
            "field `capture`: the directory",
        ),
    ];
    for (extra, wanted) in cases {
        let mut args = vec!["proxy", "--engine", "deterministic", "--check"];
        args.extend_from_slice(extra);
        let (code, _, stderr) = crate::support::gyre(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(wanted), "{extra:?}: {stderr}");
    }
    let (code, _, stderr) = crate::support::gyre(&[
        "proxy",
        "--engine",
        "deterministic",
        "--check",
        "--log",
        log,
    ]);
    assert_eq!(code, 0, "{stderr}");
}
