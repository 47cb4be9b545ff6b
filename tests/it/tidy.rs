//! The tidy test (STYLE.md rule 16): policies enforced by a test, not by review.
//!
//! - Pure crates (`event`, `scheduler`, `trajectory`, `state`) depend on no IO, async or RNG crate
//!   and mention no clock, RNG or IO API.
//! - Every Rust source file in the workspace starts with a `//!` header.
//! - No `#[ignore]`, `#[should_panic]`, `todo!` or `unimplemented!` anywhere.

use std::path::{Path, PathBuf};

const PURE_CRATES: [&str; 4] = [
    "crates/event",
    "crates/scheduler",
    "crates/trajectory",
    "crates/state",
];
const FORBIDDEN_DEPENDENCIES: [&str; 9] = [
    "tokio", "tonic", "axum", "hyper", "openraft", "rand", "reqwest", "prost", "serde",
];
const FORBIDDEN_APIS: [&str; 7] = [
    "Instant::now",
    "SystemTime::now",
    "thread_rng",
    "std::fs",
    "std::net",
    "tokio::",
    "HashMap<",
];
const FORBIDDEN_MARKERS: [&str; 4] = ["#[ignore", "#[should_panic", "todo!(", "unimplemented!("];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/cli sits two levels below the workspace root")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') && name != "testdata" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Dependency names declared in a Cargo.toml's `[dependencies]` table.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut in_dependencies = false;
    let mut names = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if in_dependencies {
            if let Some((name, _)) = line.split_once('=') {
                names.push(name.trim().trim_matches('"').to_string());
            }
        }
    }
    names
}

fn dependency_violations(manifest: &str) -> Vec<String> {
    dependencies(manifest)
        .into_iter()
        .filter(|name| {
            FORBIDDEN_DEPENDENCIES.iter().any(|bad| {
                name == bad
                    || name.starts_with(&format!("{bad}-"))
                    || name.starts_with(&format!("{bad}_"))
            })
        })
        .collect()
}

fn pure_source_violations(source: &str) -> Vec<&'static str> {
    let code: String = source
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    FORBIDDEN_APIS
        .iter()
        .copied()
        .filter(|api| code.contains(api))
        .collect()
}

fn marker_violations(source: &str) -> Vec<&'static str> {
    FORBIDDEN_MARKERS
        .iter()
        .copied()
        .filter(|marker| source.contains(marker))
        .collect()
}

fn has_header(source: &str) -> bool {
    source.trim_start().starts_with("//!")
}

#[test]
fn pure_crates_stay_pure() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for krate in PURE_CRATES {
        let dir = root.join(krate);
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        for name in dependency_violations(&manifest) {
            problems.push(format!("{krate} depends on `{name}`"));
        }
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        for file in files {
            let source = std::fs::read_to_string(&file).expect("source is readable");
            for api in pure_source_violations(&source) {
                problems.push(format!("{} uses `{api}`", file.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "purity violations:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_source_has_a_header_and_no_forbidden_markers() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    rust_files(&root.join("simulator"), &mut files);
    rust_files(&root.join("tests"), &mut files);
    assert!(files.len() > 20, "found only {} Rust files", files.len());
    let this_file = Path::new(file!()).file_name().expect("file name");
    let mut problems = Vec::new();
    for file in files {
        let source = std::fs::read_to_string(&file).expect("source is readable");
        if !has_header(&source) {
            problems.push(format!("{} lacks a `//!` header", file.display()));
        }
        // This file names the markers in order to forbid them.
        if file.file_name() != Some(this_file) && !file.ends_with("tests/it/tidy.rs") {
            for marker in marker_violations(&source) {
                problems.push(format!("{} contains `{marker}`", file.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "tidy violations:\n{}",
        problems.join("\n")
    );
}

#[test]
fn tidy_checks_can_fail() {
    assert_eq!(
        dependency_violations(
            "[dependencies]\ntokio = \"1\"\ngyre-event.workspace = true\nrand_chacha = \"0.9\"\n"
        ),
        ["tokio", "rand_chacha"]
    );
    assert!(dependency_violations("[dev-dependencies]\nproptest = \"1\"\n").is_empty());
    assert_eq!(
        pure_source_violations("let t = std::time::Instant::now();"),
        ["Instant::now"]
    );
    assert!(pure_source_violations("// Instant::now is forbidden").is_empty());
    assert!(!has_header("fn main() {}"));
    assert!(has_header("//! header\nfn main() {}"));
    assert_eq!(marker_violations("#[ignore]\nfn t() {}"), ["#[ignore"]);
}
