//! Playback: how the in-process engines (scripted, deterministic) stream an output they
//! computed up front. It owns the chunking, the optional pacing, aborts by rid, and injected
//! faults, so both engines behave identically under the stream contract of [`super`].
//!
//! Log-probs are a pure function of (position, id) ([`playback_logprob`]), so the same output
//! replayed on another engine instance carries the same behaviour log-probs.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};

use super::{ChunkStream, EngineChunk, EngineFailure, FinishKind};

/// How an in-process engine streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaybackOptions {
    /// Ids per `Tokens` chunk (at least 1).
    pub chunk_tokens: usize,
    /// Pause between chunks, to model decode speed in benchmarks; 0 streams as fast as the
    /// consumer reads.
    pub chunk_interval_us: u64,
    /// Capacity of each request's [`ChunkStream`] (at least 1).
    pub channel_capacity: usize,
}

impl Default for PlaybackOptions {
    fn default() -> Self {
        Self {
            chunk_tokens: 4,
            chunk_interval_us: 0,
            channel_capacity: 16,
        }
    }
}

/// A failure injected into one request (or every request) of an in-process engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Stream this many tokens (fewer if the output is shorter), then end with
    /// `Err(EngineFailure::Unreachable)`, as an engine that died.
    DieAfterTokens(u32),
    /// Stream this many tokens, then end with `Finished { kind: Abort }`, as an engine that
    /// aborted the request on its own (a pause for a weight update).
    AbortAfterTokens(u32),
    /// Stream this many tokens, then produce nothing until the request is aborted (it then
    /// ends with `Finished { kind: Abort }`) or dropped: a stalled engine, and a way for tests
    /// to abort at a known point.
    StallAfterTokens(u32),
}

/// The behaviour log-prob the in-process engines report for `id` at output `position`:
/// deterministic, in `[-3, 0)`.
pub fn playback_logprob(position: usize, id: u32) -> f32 {
    // splitmix64 of the pair; 24 bits of it give a uniform fraction in (0, 1].
    let mut z = ((position as u64) << 32 | u64::from(id)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let fraction = ((z >> 40) + 1) as f32 / (1u64 << 24) as f32;
    -3.0 * fraction
}

/// What one playback produces, computed before streaming.
pub(crate) struct Output {
    pub ids: Vec<u32>,
    /// `Stop` or `Length`: how the output ends when nothing interrupts it.
    pub finish: FinishKind,
    pub policy_version: u64,
}

/// How a playback ended, for the engine's bookkeeping (the scripted engine gives an
/// interrupted line back to its queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Finished(FinishKind),
    /// Aborted by [`Player::abort`] or an injected abort.
    Aborted,
    /// An injected death.
    Died,
    /// The consumer dropped the stream.
    Dropped,
}

/// Called once when a playback ends.
pub(crate) type OnEnd = Box<dyn FnOnce(Outcome) + Send>;

struct AbortSignal {
    set: AtomicBool,
    notify: Notify,
}

impl AbortSignal {
    fn raise(&self) {
        self.set.store(true, Ordering::SeqCst);
        // notify_one keeps a permit when the task is not waiting yet.
        self.notify.notify_one();
    }

    fn is_raised(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }
}

/// The shared streaming machinery of one in-process engine.
pub(crate) struct Player {
    name: String,
    options: PlaybackOptions,
    in_flight: Mutex<BTreeMap<String, Arc<AbortSignal>>>,
    /// One-shot faults, each for the next request started.
    next_faults: Mutex<VecDeque<Fault>>,
    /// A fault for every request (when no one-shot fault is queued).
    every_request_fault: Option<Fault>,
    /// How many requests are in flight, for [`Player::wait_idle`].
    in_flight_count: watch::Sender<usize>,
}

impl Player {
    pub fn new(name: String, options: PlaybackOptions, every_request_fault: Option<Fault>) -> Self {
        Self {
            name,
            options: PlaybackOptions {
                chunk_tokens: options.chunk_tokens.max(1),
                channel_capacity: options.channel_capacity.max(1),
                ..options
            },
            in_flight: Mutex::new(BTreeMap::new()),
            next_faults: Mutex::new(VecDeque::new()),
            every_request_fault,
            in_flight_count: watch::Sender::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues a fault for the next request started.
    pub fn inject(&self, fault: Fault) {
        self.next_faults
            .lock()
            .expect("the fault queue is never poisoned")
            .push_back(fault);
    }

    /// Raises the abort signal of `rid`; false when it is not in flight.
    pub fn abort(&self, rid: &str) -> bool {
        let in_flight = self
            .in_flight
            .lock()
            .expect("in-flight map is never poisoned");
        match in_flight.get(rid) {
            Some(signal) => {
                signal.raise();
                true
            }
            None => false,
        }
    }

    /// Requests in flight now.
    pub fn in_flight_count(&self) -> usize {
        *self.in_flight_count.borrow()
    }

    /// Resolves once no request is in flight (every stream ended and its end was handled).
    pub async fn wait_idle(&self) {
        let mut count = self.in_flight_count.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = count.wait_for(|count| *count == 0).await;
    }

    /// Registers `rid` (rejecting a duplicate) and spawns the task that streams `output`.
    /// Must run inside a tokio runtime.
    pub fn start(
        self: &Arc<Self>,
        rid: String,
        output: Output,
        on_end: OnEnd,
    ) -> Result<ChunkStream, EngineFailure> {
        let signal = Arc::new(AbortSignal {
            set: AtomicBool::new(false),
            notify: Notify::new(),
        });
        {
            let mut in_flight = self
                .in_flight
                .lock()
                .expect("in-flight map is never poisoned");
            if in_flight.contains_key(&rid) {
                return Err(EngineFailure::Rejected {
                    engine: self.name.clone(),
                    message: format!("request {rid:?} is already in flight"),
                });
            }
            in_flight.insert(rid.clone(), Arc::clone(&signal));
            self.in_flight_count.send_replace(in_flight.len());
        }
        let fault = self
            .next_faults
            .lock()
            .expect("the fault queue is never poisoned")
            .pop_front()
            .or(self.every_request_fault);
        let (sender, receiver) = mpsc::channel(self.options.channel_capacity);
        let player = Arc::clone(self);
        // The task is owned by the returned stream: it ends when the terminal item is sent or
        // the receiver is dropped.
        tokio::spawn(async move {
            let outcome = player.stream(&sender, &signal, output, fault).await;
            let mut in_flight = player
                .in_flight
                .lock()
                .expect("in-flight map is never poisoned");
            in_flight.remove(&rid);
            // The end is handled (a scripted line given back) before anyone sees the count
            // drop.
            on_end(outcome);
            player.in_flight_count.send_replace(in_flight.len());
        });
        Ok(receiver)
    }

    async fn stream(
        &self,
        sender: &mpsc::Sender<Result<EngineChunk, EngineFailure>>,
        signal: &AbortSignal,
        output: Output,
        fault: Option<Fault>,
    ) -> Outcome {
        let limit = match fault {
            Some(
                Fault::DieAfterTokens(tokens)
                | Fault::AbortAfterTokens(tokens)
                | Fault::StallAfterTokens(tokens),
            ) => (tokens as usize).min(output.ids.len()),
            None => output.ids.len(),
        };
        let interval = Duration::from_micros(self.options.chunk_interval_us);
        let mut position = 0;
        while position < limit {
            if signal.is_raised() {
                return self.finish_aborted(sender, output.policy_version).await;
            }
            if !interval.is_zero() && position > 0 {
                tokio::select! {
                    biased;
                    _ = signal.notify.notified() => {
                        return self.finish_aborted(sender, output.policy_version).await;
                    }
                    _ = sender.closed() => return Outcome::Dropped,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
            let end = (position + self.options.chunk_tokens).min(limit);
            let ids = output.ids[position..end].to_vec();
            let logprobs = ids
                .iter()
                .enumerate()
                .map(|(offset, &id)| playback_logprob(position + offset, id))
                .collect();
            tokio::select! {
                biased;
                _ = signal.notify.notified() => {
                    return self.finish_aborted(sender, output.policy_version).await;
                }
                sent = sender.send(Ok(EngineChunk::Tokens { ids, logprobs })) => {
                    if sent.is_err() {
                        return Outcome::Dropped;
                    }
                }
            }
            position = end;
        }
        if let Some(Fault::StallAfterTokens(_)) = fault {
            tokio::select! {
                _ = signal.notify.notified() => {
                    return self.finish_aborted(sender, output.policy_version).await;
                }
                _ = sender.closed() => return Outcome::Dropped,
            }
        }
        let (item, outcome) = match fault {
            Some(Fault::DieAfterTokens(_)) => (
                Err(EngineFailure::Unreachable {
                    engine: self.name.clone(),
                    message: format!("injected fault: died after {limit} tokens"),
                }),
                Outcome::Died,
            ),
            Some(Fault::AbortAfterTokens(_)) => (
                Ok(EngineChunk::Finished {
                    kind: FinishKind::Abort,
                    policy_version: output.policy_version,
                }),
                Outcome::Aborted,
            ),
            _ if signal.is_raised() => (
                Ok(EngineChunk::Finished {
                    kind: FinishKind::Abort,
                    policy_version: output.policy_version,
                }),
                Outcome::Aborted,
            ),
            _ => (
                Ok(EngineChunk::Finished {
                    kind: output.finish,
                    policy_version: output.policy_version,
                }),
                Outcome::Finished(output.finish),
            ),
        };
        match sender.send(item).await {
            Ok(()) => outcome,
            Err(_) => Outcome::Dropped,
        }
    }

    async fn finish_aborted(
        &self,
        sender: &mpsc::Sender<Result<EngineChunk, EngineFailure>>,
        policy_version: u64,
    ) -> Outcome {
        let finished = EngineChunk::Finished {
            kind: FinishKind::Abort,
            policy_version,
        };
        match sender.send(Ok(finished)).await {
            Ok(()) => Outcome::Aborted,
            Err(_) => Outcome::Dropped,
        }
    }
}
