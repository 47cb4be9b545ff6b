//! Execution credentials that survive a proxy restart (`gyre proxy --credentials FILE`).
//!
//! A credential is a random token handed to one execution's harness. The file keeps, for each
//! credential the proxy issued, the SHA-256 of the token (never the token: the file is no key
//! store), the execution and engine it opened, and whether it was closed — as JSON lines,
//! each appended and `fdatasync`ed before the credential or the close is acknowledged:
//!
//! ```text
//! {"open":{"token_sha256":"9f…","execution":7,"engine":0}}
//! {"close":{"token_sha256":"9f…"}}
//! ```
//!
//! After a restart the proxy accepts every open credential again (the execution's session is
//! rebuilt from the log, see `AppState::recover`), keeps closed ones closed, and numbers new
//! executions after every one it issued. A last line without its newline is a write the crash
//! cut short (never acknowledged): it is dropped. Any other bad line is refused, naming it.
//!
//! The file grows by two lines per execution. When a start finds more than
//! [`COMPACT_AFTER_CLOSED`] closed credentials, and more closed than open ones, it rewrites the
//! file (temporary file, fsync, rename, fsync of the directory) as the open credentials and a
//! `{"next":{"execution":N}}` line that keeps the numbering and a `{"closed":{"executions":
//! [..]}}` line that keeps the ids of the closed executions (an id is opened once, even by
//! name, and on a control quorum the proxy does not read closed executions' records back); a
//! closed credential is then unknown, which also gets 401.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// SHA-256 of a token, as the file stores it.
pub type TokenHash = [u8; 32];

pub fn token_hash(token: &str) -> TokenHash {
    Sha256::digest(token.as_bytes()).into()
}

/// What the file says about one credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Issued {
    pub execution: u64,
    pub engine: usize,
    pub closed: bool,
}

/// The file's contents.
#[derive(Clone, Debug, Default)]
pub struct IssuedCredentials {
    pub by_hash: HashMap<TokenHash, Issued>,
    /// The highest execution id any credential opened (0 if none).
    pub max_execution: u64,
    /// Executions whose credentials a compaction dropped (closed): their ids stay taken.
    pub closed_executions: Vec<u64>,
}

impl IssuedCredentials {
    /// Every execution id a credential of the file opened, closed or not.
    pub fn executions(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_hash
            .values()
            .map(|entry| entry.execution)
            .chain(self.closed_executions.iter().copied())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenLine {
    token_sha256: String,
    execution: u64,
    engine: usize,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseLine {
    token_sha256: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NextLine {
    /// Every execution up to this id was issued (what a compaction keeps of closed ones).
    execution: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClosedLine {
    /// Executions a compaction dropped the (closed) credentials of.
    executions: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
enum Line {
    Open(OpenLine),
    Close(CloseLine),
    Next(NextLine),
    Closed(ClosedLine),
}

/// Closed credentials a start tolerates in the file before it compacts it.
pub const COMPACT_AFTER_CLOSED: usize = 4096;

fn hex(hash: &TokenHash) -> String {
    hash.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn parse_hex(text: &str) -> Option<TokenHash> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut hash = [0u8; 32];
    for (at, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * at..2 * at + 2], 16).ok()?;
    }
    Some(hash)
}

/// Parses the file's bytes. Returns the credentials and the length of the whole lines (a
/// torn last line is not counted, so the caller cuts it off).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<(IssuedCredentials, usize), String> {
    let mut issued = IssuedCredentials::default();
    let whole = bytes
        .iter()
        .rposition(|byte| *byte == b'\n')
        .map_or(0, |at| at + 1);
    for (number, line) in bytes[..whole].split(|byte| *byte == b'\n').enumerate() {
        let number = number + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let bad = |detail: String| format!("{}: line {number}: {detail}", path.display());
        let parsed: Line = serde_json::from_slice(line).map_err(|error| bad(error.to_string()))?;
        match parsed {
            Line::Open(open) => {
                let hash = parse_hex(&open.token_sha256)
                    .ok_or_else(|| bad("`token_sha256` is not 64 hex digits".into()))?;
                issued.max_execution = issued.max_execution.max(open.execution);
                issued.by_hash.insert(
                    hash,
                    Issued {
                        execution: open.execution,
                        engine: open.engine,
                        closed: false,
                    },
                );
            }
            Line::Close(close) => {
                let hash = parse_hex(&close.token_sha256)
                    .ok_or_else(|| bad("`token_sha256` is not 64 hex digits".into()))?;
                let entry = issued
                    .by_hash
                    .get_mut(&hash)
                    .ok_or_else(|| bad("closes a credential no earlier line opened".into()))?;
                entry.closed = true;
            }
            Line::Next(next) => {
                issued.max_execution = issued.max_execution.max(next.execution);
            }
            Line::Closed(closed) => {
                if let Some(max) = closed.executions.iter().max() {
                    issued.max_execution = issued.max_execution.max(*max);
                }
                issued.closed_executions.extend(closed.executions);
            }
        }
    }
    Ok((issued, whole))
}

/// Rewrites `path` as `issued` (open credentials, the numbering and the closed executions'
/// ids) through a temporary file, crash-safely; returns the new file opened for appending.
fn compact(path: &Path, issued: &IssuedCredentials) -> Result<File, String> {
    let shown = |error: std::io::Error| format!("{}: {error}", path.display());
    let mut name = path.as_os_str().to_owned();
    name.push(".compacting");
    let temporary = PathBuf::from(name);
    let mut text = serde_json::to_string(&Line::Next(NextLine {
        execution: issued.max_execution,
    }))
    .map_err(|error| error.to_string())?;
    text.push('\n');
    if !issued.closed_executions.is_empty() {
        let mut executions = issued.closed_executions.clone();
        executions.sort_unstable();
        executions.dedup();
        text.push_str(
            &serde_json::to_string(&Line::Closed(ClosedLine { executions }))
                .map_err(|error| error.to_string())?,
        );
        text.push('\n');
    }
    let mut open: Vec<(&TokenHash, &Issued)> = issued.by_hash.iter().collect();
    open.sort_by_key(|(hash, entry)| (entry.execution, **hash));
    for (hash, entry) in open {
        let line = Line::Open(OpenLine {
            token_sha256: hex(hash),
            execution: entry.execution,
            engine: entry.engine,
        });
        text.push_str(&serde_json::to_string(&line).map_err(|error| error.to_string())?);
        text.push('\n');
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(shown)?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(shown)?;
    std::fs::rename(&temporary, path).map_err(shown)?;
    gyre_log::file::sync_parent_directory(path).map_err(shown)?;
    OpenOptions::new().append(true).open(path).map_err(shown)
}

/// The open credential file; appends are serialised and each is durable before it returns.
pub struct CredentialFile {
    path: PathBuf,
    file: Mutex<File>,
}

impl CredentialFile {
    /// Opens (creating, mode 0600) `path` and reads what it holds, compacting it past
    /// [`COMPACT_AFTER_CLOSED`] closed credentials.
    pub fn open(path: &Path) -> Result<(CredentialFile, IssuedCredentials), String> {
        Self::open_compacting(path, COMPACT_AFTER_CLOSED)
    }

    /// [`CredentialFile::open`] with the compaction threshold given.
    pub fn open_compacting(
        path: &Path,
        compact_after_closed: usize,
    ) -> Result<(CredentialFile, IssuedCredentials), String> {
        let shown = |error: std::io::Error| format!("{}: {error}", path.display());
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(shown)?;
        if created {
            // The new name must survive a crash too.
            gyre_log::file::sync_parent_directory(path).map_err(shown)?;
        }
        let bytes = std::fs::read(path).map_err(shown)?;
        let (issued, whole) = parse(path, &bytes)?;
        if whole < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                dropped_bytes = bytes.len() - whole,
                "dropping a credential line a crash cut short (it was never acknowledged)"
            );
            file.set_len(whole as u64).map_err(shown)?;
            file.sync_data().map_err(shown)?;
        }
        file.flush().map_err(shown)?;
        let mut issued = issued;
        let closed = issued.by_hash.values().filter(|entry| entry.closed).count();
        if closed > compact_after_closed && closed * 2 > issued.by_hash.len() {
            let dropped: Vec<u64> = issued
                .by_hash
                .values()
                .filter(|entry| entry.closed)
                .map(|entry| entry.execution)
                .collect();
            issued.closed_executions.extend(dropped);
            issued.by_hash.retain(|_, entry| !entry.closed);
            file = compact(path, &issued)?;
            tracing::info!(path = %path.display(), closed, open = issued.by_hash.len(), "compacted the credential file");
        }
        Ok((
            CredentialFile {
                path: path.to_path_buf(),
                file: Mutex::new(file),
            },
            issued,
        ))
    }

    fn append(&self, line: &Line) -> Result<(), String> {
        let mut text = serde_json::to_string(line).map_err(|error| error.to_string())?;
        text.push('\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|error| format!("{}: {error}", self.path.display()))
    }

    pub fn record_open(
        &self,
        hash: &TokenHash,
        execution: u64,
        engine: usize,
    ) -> Result<(), String> {
        self.append(&Line::Open(OpenLine {
            token_sha256: hex(hash),
            execution,
            engine,
        }))
    }

    pub fn record_close(&self, hash: &TokenHash) -> Result<(), String> {
        self.append(&Line::Close(CloseLine {
            token_sha256: hex(hash),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_and_closes_survive_a_reopen_and_a_torn_line_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("credentials");
        let (file, issued) = CredentialFile::open(&path).expect("create");
        assert!(issued.by_hash.is_empty());
        let (a, b) = (token_hash("gx-a"), token_hash("gx-b"));
        file.record_open(&a, 3, 1).expect("open a");
        file.record_open(&b, 9, 0).expect("open b");
        file.record_close(&a).expect("close a");
        drop(file);
        // A crash in the middle of the next append.
        let mut raw = OpenOptions::new().append(true).open(&path).expect("raw");
        raw.write_all(b"{\"open\":{\"token_sha").expect("torn");
        drop(raw);
        let (file, issued) = CredentialFile::open(&path).expect("reopen");
        assert_eq!(issued.max_execution, 9);
        assert_eq!(
            issued.by_hash[&a],
            Issued {
                execution: 3,
                engine: 1,
                closed: true
            }
        );
        assert!(!issued.by_hash[&b].closed);
        file.record_close(&b).expect("appends after the cut");
        let (_, issued) = CredentialFile::open(&path).expect("third open");
        assert!(issued.by_hash[&b].closed);
    }

    #[test]
    fn a_file_of_mostly_closed_credentials_is_compacted_keeping_the_numbering() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("credentials");
        let (file, _) = CredentialFile::open(&path).expect("create");
        for execution in 1..=10u64 {
            let hash = token_hash(&format!("gx-{execution}"));
            file.record_open(&hash, execution, 0).expect("open");
            if execution != 4 {
                file.record_close(&hash).expect("close");
            }
        }
        drop(file);
        let (file, issued) = CredentialFile::open_compacting(&path, 3).expect("compacts");
        assert_eq!(issued.max_execution, 10);
        assert_eq!(issued.by_hash.len(), 1, "only the open credential is kept");
        assert_eq!(issued.by_hash[&token_hash("gx-4")].execution, 4);
        let mut closed = issued.closed_executions.clone();
        closed.sort_unstable();
        assert_eq!(closed, vec![1, 2, 3, 5, 6, 7, 8, 9, 10]);
        assert_eq!(
            std::fs::read_to_string(&path)
                .expect("read")
                .lines()
                .count(),
            3,
            "the numbering, the closed executions and the open credential"
        );
        file.record_close(&token_hash("gx-4"))
            .expect("appends after compacting");
        let (_, issued) = CredentialFile::open_compacting(&path, 3).expect("reopens");
        assert_eq!(
            issued.max_execution, 10,
            "new executions still come after 10"
        );
        assert!(issued.by_hash[&token_hash("gx-4")].closed);
        let mut taken: Vec<u64> = issued.executions().collect();
        taken.sort_unstable();
        assert_eq!(
            taken,
            (1..=10).collect::<Vec<_>>(),
            "a closed execution's id stays taken through a compaction"
        );
    }

    #[test]
    fn a_bad_line_is_refused_naming_it() {
        let path = Path::new("creds");
        let error = parse(
            path,
            b"{\"open\":{\"token_sha256\":\"zz\",\"execution\":1,\"engine\":0}}\n",
        )
        .expect_err("bad hash");
        assert!(error.contains("creds: line 1: `token_sha256`"), "{error}");
        let error = parse(path, b"\n{\"close\":{\"token_sha256\":\"00\"}}\n").expect_err("short");
        assert!(error.contains("line 2"), "{error}");
        let close = format!("{{\"close\":{{\"token_sha256\":\"{}\"}}}}\n", hex(&[7; 32]));
        let error = parse(path, close.as_bytes()).expect_err("unopened");
        assert!(error.contains("no earlier line opened"), "{error}");
        let error = parse(path, b"{\"reopen\":{}}\n").expect_err("unknown");
        assert!(error.contains("line 1"), "{error}");
    }
}
