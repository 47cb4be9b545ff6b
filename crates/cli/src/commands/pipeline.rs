//! Two-stage pipelines for batch work over a log: one thread reads, verifies and decodes
//! entries while this one folds them, so `gyre replay` and the replay benchmark use both cores
//! of a small host. The fold stays single-threaded and in log order (it is a deterministic
//! projection); only the decode moves.

use std::sync::mpsc::{sync_channel, Receiver};

/// Items are handed over in chunks of this many: one channel operation (and at most one
/// wake-up) per chunk instead of per item, for logs of many small entries.
const CHUNK: usize = 32;
/// Chunks decoded ahead of the consumer: bounds the memory the producer can run ahead by.
const CHUNKS_AHEAD: usize = 8;

/// Runs `produce` on a thread of its own and `consume` on this one, items flowing in order
/// through a bounded channel. `produce` gets a `send` function that returns `false` once the
/// consumer has returned; both results come back. A panic on either side is resumed here.
pub fn ahead<T, P, R>(
    produce: impl FnOnce(&mut dyn FnMut(T) -> bool) -> P + Send,
    consume: impl FnOnce(&mut dyn Iterator<Item = T>) -> R,
) -> (P, R)
where
    T: Send,
    P: Send,
{
    let (tx, rx) = sync_channel::<Vec<T>>(CHUNKS_AHEAD);
    std::thread::scope(|scope| {
        let producer = scope.spawn(move || {
            let mut chunk = Vec::with_capacity(CHUNK);
            let mut open = true;
            let produced = produce(&mut |item| {
                if !open {
                    return false;
                }
                chunk.push(item);
                if chunk.len() == CHUNK {
                    let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                    open = tx.send(full).is_ok();
                }
                open
            });
            if open && !chunk.is_empty() {
                let _ = tx.send(chunk);
            }
            produced
        });
        let consumed = consume(&mut Chunks {
            rx,
            current: Vec::new().into_iter(),
        });
        // `consume` owned the receiver through `Chunks`, dropped with it: a producer still
        // sending sees the channel closed and returns.
        match producer.join() {
            Ok(produced) => (produced, consumed),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

struct Chunks<T> {
    rx: Receiver<Vec<T>>,
    current: std::vec::IntoIter<T>,
}

impl<T> Iterator for Chunks<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        loop {
            if let Some(item) = self.current.next() {
                return Some(item);
            }
            self.current = self.rx.recv().ok()?.into_iter();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_arrive_in_order_and_both_results_come_back() {
        let (produced, consumed) = ahead(
            |send| {
                let mut sent = 0u64;
                for item in 0..1000u64 {
                    if !send(item) {
                        break;
                    }
                    sent += 1;
                }
                sent
            },
            |items| items.collect::<Vec<u64>>(),
        );
        assert_eq!(produced, 1000);
        assert_eq!(consumed, (0..1000).collect::<Vec<u64>>());
    }

    #[test]
    fn a_consumer_that_stops_early_stops_the_producer() {
        let (produced, consumed) = ahead(
            |send| {
                let mut sent = 0u64;
                // Endless unless `send` reports the consumer gone.
                for item in 0u64.. {
                    if !send(item) {
                        break;
                    }
                    sent += 1;
                }
                sent
            },
            |items| items.take(100).sum::<u64>(),
        );
        assert_eq!(consumed, (0..100).sum::<u64>());
        assert!(produced >= 100, "the producer sent {produced} items");
    }

    #[test]
    fn an_empty_producer_ends_the_consumer() {
        let (_, consumed) = ahead(
            |_send: &mut dyn FnMut(u8) -> bool| (),
            |items| items.count(),
        );
        assert_eq!(consumed, 0);
    }
}
