//! The meta file: vote, committed log id and last purged log id (with its chain hash).
//!
//! ```text
//! meta = magic "GYRE-MTA" (8), format_version u32 = 1, body_len u32, body_crc u32, body (JSON)
//! ```
//! Replaced atomically: written to `meta.tmp`, fsync'd, renamed over `meta`, then the directory
//! is fsync'd. A damaged meta file is refused, never ignored: it holds the vote, and forgetting
//! a vote can elect two leaders in one term.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::RaftStoreError;
use super::types::{LogId, Vote};
use crate::file::{read_u32, ChainHash};

pub const META_MAGIC: [u8; 8] = *b"GYRE-MTA";
pub const META_FORMAT_VERSION: u32 = 1;
const META_HEADER_LEN: usize = 20;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub vote: Option<Vote>,
    pub committed: Option<LogId>,
    pub last_purged: Option<LogId>,
    /// Chain hash of the last purged entry, when this node had that entry.
    pub last_purged_hash: Option<ChainHash>,
}

pub fn meta_path(dir: &Path) -> PathBuf {
    dir.join("meta")
}

/// Reads the meta file of `dir`; `Meta::default()` when there is none yet.
pub fn read_meta(dir: &Path) -> Result<Meta, RaftStoreError> {
    let path = meta_path(dir);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Meta::default()),
        Err(source) => {
            return Err(RaftStoreError::Io {
                path,
                action: "read meta",
                source,
            })
        }
    };
    let bad = |detail: String| RaftStoreError::BadMeta {
        path: path.clone(),
        detail,
    };
    if bytes.len() < META_HEADER_LEN || bytes[0..8] != META_MAGIC {
        return Err(bad("not a Gyre meta file (bad magic or too short)".into()));
    }
    let version = read_u32(&bytes[8..12]);
    if version != META_FORMAT_VERSION {
        return Err(bad(format!(
            "meta format version {version} is not readable"
        )));
    }
    let body_len = read_u32(&bytes[12..16]) as usize;
    let stored_crc = read_u32(&bytes[16..20]);
    let body = &bytes[META_HEADER_LEN..];
    if body.len() != body_len {
        return Err(bad(format!(
            "body is {} bytes, header says {body_len}",
            body.len()
        )));
    }
    let computed = crc32c::crc32c(body);
    if computed != stored_crc {
        return Err(bad(format!(
            "checksum mismatch (stored {stored_crc:#010x}, computed {computed:#010x})"
        )));
    }
    serde_json::from_slice(body).map_err(|error| bad(format!("body does not parse: {error}")))
}

/// Replaces the meta file of `dir` durably (tmp, fsync, rename, fsync directory).
pub fn write_meta(dir: &Path, meta: &Meta) -> Result<(), RaftStoreError> {
    let body = serde_json::to_vec(meta).expect("meta of plain ids always serialises");
    let mut bytes = Vec::with_capacity(META_HEADER_LEN + body.len());
    bytes.extend_from_slice(&META_MAGIC);
    bytes.extend_from_slice(&META_FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(
        &u32::try_from(body.len())
            .expect("meta is a few hundred bytes")
            .to_le_bytes(),
    );
    bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    write_file_atomically(&meta_path(dir), &bytes)
}

/// Writes `bytes` to `path` so that after a crash `path` holds either the old or the new
/// contents: `<path>.tmp`, fsync, rename, fsync of the directory.
pub fn write_file_atomically(path: &Path, bytes: &[u8]) -> Result<(), RaftStoreError> {
    write_parts_atomically(path, &[bytes])
}

/// [`write_file_atomically`] of the concatenation of `parts`, without copying them into one
/// buffer first (a snapshot's header and its body, which may be gigabytes).
pub fn write_parts_atomically(path: &Path, parts: &[&[u8]]) -> Result<(), RaftStoreError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(RaftStoreError::io(&tmp, "create"))?;
        for part in parts {
            file.write_all(part)
                .map_err(RaftStoreError::io(&tmp, "write"))?;
        }
        file.sync_all().map_err(RaftStoreError::io(&tmp, "sync"))?;
    }
    fs::rename(&tmp, path).map_err(RaftStoreError::io(path, "rename into place"))?;
    sync_directory(parent_of(path))
}

pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Makes directory entries (creations, renames, deletions) in `dir` durable.
pub fn sync_directory(dir: &Path) -> Result<(), RaftStoreError> {
    File::open(dir)
        .and_then(|directory| directory.sync_all())
        .map_err(RaftStoreError::io(dir, "sync directory"))
}
