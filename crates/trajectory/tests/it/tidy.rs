//! Tidy: the crate stays pure (STYLE rule 16). Fails if a source file lacks a `//!` header,
//! mentions a clock, a global random source or a `RandomState` map, or the manifest pulls in
//! an async runtime or `rand`.

use std::path::Path;

const FORBIDDEN_SOURCE: &[&str] = &[
    concat!("Instant", "::now"),
    concat!("SystemTime", "::now"),
    concat!("thread", "_rng"),
    concat!("Hash", "Map"),
    concat!("Hash", "Set"),
    concat!("std::", "fs"),
    concat!("std::", "io"),
    concat!("std::", "net"),
    concat!("tok", "io"),
];

const FORBIDDEN_DEPENDENCIES: &[&str] = &["tokio", "tonic", "axum", "openraft", "rand"];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source directory is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            out.push(path);
        }
    }
}

fn violations(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    if !source.starts_with("//!") {
        found.push("missing //! header".to_string());
    }
    for word in FORBIDDEN_SOURCE {
        if source.contains(word) {
            found.push(format!("mentions {word}"));
        }
    }
    found
}

#[test]
fn sources_are_pure_and_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(!files.is_empty());
    for file in files {
        let source = std::fs::read_to_string(&file).expect("source is readable");
        assert_eq!(
            violations(&source),
            Vec::<String>::new(),
            "{}",
            file.display()
        );
    }
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("manifest is readable");
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .unwrap_or("")
        .split("\n[")
        .next()
        .unwrap_or("");
    for line in dependencies.lines() {
        let name = line.split(['=', '.']).next().unwrap_or("").trim();
        assert!(
            !FORBIDDEN_DEPENDENCIES.contains(&name),
            "pure crate depends on {name}"
        );
    }
}

#[test]
fn tidy_can_fail() {
    assert!(!violations("fn main() {}").is_empty());
    assert!(!violations(concat!("//! x\nlet t = std::time::Instant", "::now();")).is_empty());
    assert!(violations("//! fine\n").is_empty());
}
