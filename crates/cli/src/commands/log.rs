//! `gyre log append | tail | export`: operator tools on a control cluster's replicated log.
//!
//! - `append --cluster ADDRS`: events as JSON lines on stdin (the form in docs/control.md), sent
//!   in requests of up to `--batch` lines and at most one log entry's bytes (16 MiB); prints
//!   each committed event's sequence `INDEX.POSITION`.
//! - `tail --cluster ADDRS [--from SEQ] [--follow]`: committed events as JSON lines, each with
//!   its `seq`.
//! - `export --node ADDR --out FILE`: the node's log as an event file `gyre replay` reads; blank
//!   and membership entries become empty batches so record indexes equal Raft indexes.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use gyre_control::json::{event_to_json, parse_event};
use gyre_control::{ClusterClient, Sequence};
use gyre_log::EventFileWriter;

#[derive(Args, Debug)]
pub struct LogArgs {
    #[command(subcommand)]
    command: LogCommand,
}

#[derive(Subcommand, Debug)]
enum LogCommand {
    /// Append events read as JSON lines from stdin; print each event's sequence once committed.
    Append {
        /// Node addresses, `host:port,host:port,...` (any node; writes reach the leader).
        #[arg(long)]
        cluster: String,
        /// Lines per request (one request commits atomically, in one Raft entry). A request is
        /// also cut before it would exceed what one entry may hold (16 MiB).
        #[arg(long, default_value_t = 64, value_parser = super::values::at_least_one_usize())]
        batch: usize,
    },
    /// Print committed events as JSON lines.
    Tail {
        /// Node addresses, `host:port,host:port,...` (any node that answers).
        #[arg(long)]
        cluster: String,
        /// First sequence, `INDEX` or `INDEX.POSITION`.
        #[arg(long, default_value = "0")]
        from: String,
        /// Keep printing new events as they commit.
        #[arg(long)]
        follow: bool,
    },
    /// Write a node's log to an event file (`gyre replay FILE` reads it).
    Export {
        /// The node whose log is written, `host:port`. Entries purged behind a snapshot come
        /// from the node's archive (`gyre control run --archive-purged`, on by default), so the
        /// file holds the whole committed log; a node without one (or whose log restarted
        /// behind a received snapshot) is written from the first entry it still holds.
        #[arg(long)]
        node: String,
        /// The event file to create; an existing file is never overwritten.
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(args: LogArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        match args.command {
            LogCommand::Append { cluster, batch } => append(&cluster, batch.max(1)).await,
            LogCommand::Tail {
                cluster,
                from,
                follow,
            } => tail(&cluster, &from, follow).await,
            LogCommand::Export { node, out } => export(&node, &out).await,
        }
    })
}

/// Appends `events` and prints their sequence numbers while `printing`. A reader that went
/// away (`gyre log append < f | head -1`) ends the printing, not the appending: every line of
/// stdin is still appended, as asked.
async fn send(
    client: &mut ClusterClient,
    events: &[gyre_event::Event],
    out: &mut impl Write,
    printing: &mut bool,
) -> anyhow::Result<()> {
    let (sequences, rejected) = client.append(events).await?;
    if !*printing {
        return Ok(());
    }
    let mut print = || -> std::io::Result<()> {
        for (position, sequence) in sequences.iter().enumerate() {
            match rejected.get(position).filter(|reason| !reason.is_empty()) {
                Some(reason) => writeln!(out, "{sequence} refused: {reason}")?,
                None => writeln!(out, "{sequence}")?,
            }
        }
        out.flush()
    };
    match print() {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => *printing = false,
        other => other?,
    }
    Ok(())
}

async fn append(cluster: &str, batch: usize) -> anyhow::Result<()> {
    let mut client = ClusterClient::new(cluster).context("--cluster")?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut printing = true;
    let mut pending = Vec::new();
    // Bytes of `pending` as a log entry: a request stays within what one entry may hold.
    let mut pending_bytes = 0usize;
    for (number, line) in stdin.lock().lines().enumerate() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let event = parse_event(&line)
            .map_err(|error| anyhow::anyhow!("stdin line {}: {error}", number + 1))?;
        let bytes = gyre_log::encode_batch(std::slice::from_ref(&event)).len();
        if !pending.is_empty() && pending_bytes + bytes > gyre_control::ENTRY_BYTES_MAX {
            send(&mut client, &pending, &mut out, &mut printing).await?;
            pending.clear();
            pending_bytes = 0;
        }
        pending.push(event);
        pending_bytes += bytes;
        if pending.len() >= batch {
            send(&mut client, &pending, &mut out, &mut printing).await?;
            pending.clear();
            pending_bytes = 0;
        }
    }
    if !pending.is_empty() {
        send(&mut client, &pending, &mut out, &mut printing).await?;
    }
    Ok(())
}

async fn tail(cluster: &str, from: &str, follow: bool) -> anyhow::Result<()> {
    let from: Sequence = from.parse().map_err(anyhow::Error::msg).context("--from")?;
    let mut client = ClusterClient::new(cluster).context("--cluster")?;
    let mut stream = client.subscribe(from, !follow).await?;
    let mut out = std::io::stdout().lock();
    while let Some(entry) = stream.message().await.context("subscription")? {
        let events = gyre_log::decode_batch(&entry.batch)
            .with_context(|| format!("entry {} does not decode", entry.index))?;
        for (offset, event) in events.iter().enumerate() {
            let mut line = serde_json::Map::new();
            let position = entry.first_position as usize + offset;
            line.insert(
                "seq".to_string(),
                format!("{}.{position}", entry.index).into(),
            );
            if let serde_json::Value::Object(fields) = event_to_json(event) {
                line.extend(fields);
            }
            if let Err(error) = writeln!(out, "{}", serde_json::Value::Object(line)) {
                return closed_pipe_is_the_end(error);
            }
        }
        if let Err(error) = out.flush() {
            return closed_pipe_is_the_end(error);
        }
    }
    Ok(())
}

/// A reader that went away (`gyre log tail … | head`) ends the command quietly.
fn closed_pipe_is_the_end(error: std::io::Error) -> anyhow::Result<()> {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(anyhow::Error::new(error).context("writing to stdout"))
    }
}

async fn export(node: &str, out: &std::path::Path) -> anyhow::Result<()> {
    let mut client = ClusterClient::new(node).context("--node")?;
    let mut stream = client.export(node, 1).await?;
    let mut writer: Option<EventFileWriter> = None;
    let mut records = 0u64;
    while let Some(entry) = stream.message().await.context("export stream")? {
        let file = match &mut writer {
            Some(file) => file,
            None => {
                // A log purged behind a snapshot starts mid-chain; its base hash is unknown here,
                // so the file restarts the chain at this index (docs/control.md).
                let file =
                    EventFileWriter::create_at(out, entry.index, gyre_log::file::GENESIS_HASH)
                        .with_context(|| format!("creating {}", out.display()))?;
                writer.insert(file)
            }
        };
        if file.next_index() != entry.index {
            bail!(
                "node sent entry {} but {} was expected",
                entry.index,
                file.next_index()
            );
        }
        file.set_term(entry.term);
        file.append_payload(&entry.batch)?;
        records += 1;
    }
    let Some(mut file) = writer else {
        bail!("node {node} has no committed entries to export");
    };
    file.sync()?;
    outln!(
        "exported {records} entries ({}..{}) to {}; head hash {}",
        file.next_index() - records,
        file.next_index() - 1,
        out.display(),
        gyre_log::file::hex(&file.head_hash())
    );
    Ok(())
}
