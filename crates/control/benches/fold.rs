//! `cargo bench -p gyre-control --bench fold [-- EVENTS_PER_WRITER]`: the state machine's
//! per-event CPU, single-threaded, on the `gyre bench log` workload (256 writers, each extending
//! its execution with ~256 B TITO records, interleaved in entries of 128 events):
//!
//! - validate: what the leader's control service does to an append (`validated_records`);
//! - decode: an entry's payload to events (`decode_batch_shared`), dropped;
//! - decode + fold: decode and `ControlProjection::apply_events`, as every replica applies an
//!   entry and as `gyre replay` does; printed as events/s beside the replay goal (≥ 1M);
//! - drop: freeing the folded state;
//! - state: the heap bytes the folded projection holds per event (as requested of the allocator).
//!
//! Three rounds; the machine is noisy, read the best or the median.

// A counting wrapper around the global allocator: the benchmark's only unsafe code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use gyre_log::raft::Projection;

/// mimalloc (as the `gyre` binary uses) counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to mimalloc, which upholds `GlobalAlloc`'s contract;
// the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let writers: u64 = 256;
    // `cargo bench` passes `--bench`; the first numeric argument, if any, is the count.
    let per_writer: u64 = std::env::args()
        .skip(1)
        .find_map(|argument| argument.parse().ok())
        .unwrap_or(1500);
    let batch_events = 128usize;
    let mut events = Vec::new();
    for seq in 0..per_writer {
        for w in 0..writers {
            events.push(gyre_control::workload::small_event(w, seq));
        }
    }
    let batches: Vec<bytes::Bytes> = events
        .chunks(batch_events)
        .map(|chunk| bytes::Bytes::from(gyre_log::encode_batch(chunk)))
        .collect();
    let total = events.len() as f64;
    drop(events);
    for round in 0..3 {
        let started = Instant::now();
        for batch in &batches {
            let records = gyre_log::validated_records(batch).unwrap();
            std::hint::black_box(records);
        }
        let validate = started.elapsed().as_secs_f64();
        let started = Instant::now();
        for batch in &batches {
            let events = gyre_log::decode_batch_shared(batch).unwrap();
            std::hint::black_box(events);
        }
        let decode = started.elapsed().as_secs_f64();
        let live_before = LIVE.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut projection = gyre_control::ControlProjection::new();
        for (index, batch) in batches.iter().enumerate() {
            let events = gyre_log::decode_batch_shared(batch).unwrap();
            let outcome = projection.apply_events(index as u64 + 1, batch, events);
            assert!(outcome.is_ok(), "the projection refused a benchmark event");
        }
        let fold = started.elapsed().as_secs_f64();
        let held = LIVE.load(Ordering::Relaxed).saturating_sub(live_before);
        let started = Instant::now();
        drop(projection);
        let dropped = started.elapsed().as_secs_f64();
        println!(
            "round {round}: validate {:.0} ns/ev, decode {:.0} ns/ev, decode+fold {:.0} ns/ev ({:.2} M ev/s), drop {:.0} ns/ev, state {:.0} B/ev",
            validate / total * 1e9,
            decode / total * 1e9,
            fold / total * 1e9,
            total / fold / 1e6,
            dropped / total * 1e9,
            held as f64 / total
        );
    }
}
