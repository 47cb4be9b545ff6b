//! [`EmbeddedEngine`]: the CPU policy behind the `gyre_engine::RolloutEngine` trait.
//!
//! One named worker thread owns the model and a [`DecodeBatch`]; callers talk to it through a
//! bounded channel of [`Input`]s. The loop admits queued requests up to `batch_max`, advances
//! every active sequence by one token per iteration, and checks cancel flags between tokens.
//! A weight update is a barrier: requests submitted before it are admitted and finish on the old
//! weights (every generation carries exactly one policy version), requests submitted after it
//! wait; once the old ones drained the weights are swapped and admission resumes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use gyre_engine::{
    CancelToken, EngineError, Generation, GenerationRequest, PendingGeneration, RolloutEngine,
    WeightUpdate,
};
use gyre_event::PolicyVersion;

use crate::generation::{DecodeBatch, Finished};
use crate::{ModelError, Policy};

/// Engine limits.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Sequences decoding together.
    pub batch_max: usize,
    /// Requests submitted and not yet answered; more are rejected.
    pub requests_max: usize,
    /// Off only for benchmarks: recompute every sequence at every token.
    pub kv_cache: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            batch_max: 32,
            requests_max: 1024,
            kv_cache: true,
        }
    }
}

type Reply = Sender<Result<Generation, EngineError>>;

/// An update waiting for older requests to drain: the update, its reply, and the first ticket
/// submitted after it (the barrier).
type PendingUpdate = (
    WeightUpdate,
    Sender<Result<PolicyVersion, EngineError>>,
    u64,
);

enum Input {
    Generate {
        request: GenerationRequest,
        cancel: CancelToken,
        reply: Reply,
    },
    UpdateWeights {
        update: WeightUpdate,
        reply: Sender<Result<PolicyVersion, EngineError>>,
    },
    AbortAll {
        reply: Sender<usize>,
    },
    Shutdown,
}

/// The embedded CPU policy as a rollout engine.
pub struct EmbeddedEngine {
    inputs: SyncSender<Input>,
    version: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
    config: EngineConfig,
    worker: Option<JoinHandle<()>>,
}

impl EmbeddedEngine {
    /// Starts the worker thread that owns `policy`, serving `version`.
    pub fn start(
        policy: Policy,
        version: PolicyVersion,
        config: EngineConfig,
    ) -> Result<Self, ModelError> {
        if config.batch_max == 0 || config.requests_max == 0 {
            return Err(ModelError::config(
                "batch_max",
                "batch_max and requests_max must be positive",
            ));
        }
        let (inputs, receiver) = sync_channel(config.requests_max + 8);
        let shared_version = Arc::new(AtomicU64::new(version.get()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let worker = Worker {
            policy,
            version,
            config: config.clone(),
            shared_version: shared_version.clone(),
            in_flight: in_flight.clone(),
            batch: DecodeBatch::new(version, config.kv_cache),
            waiting: VecDeque::new(),
            replies: BTreeMap::new(),
            pending_update: None,
            next_ticket: 0,
        };
        let worker = std::thread::Builder::new()
            .name("gyre-model-engine".into())
            .spawn(move || worker.run(receiver))?;
        Ok(Self {
            inputs,
            version: shared_version,
            in_flight,
            config,
            worker: Some(worker),
        })
    }

    fn send(&self, input: Input) -> Result<(), EngineError> {
        match self.inputs.try_send(input) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(EngineError::QueueFull {
                capacity: self.config.requests_max,
            }),
            Err(TrySendError::Disconnected(_)) => Err(EngineError::Stopped),
        }
    }
}

impl RolloutEngine for EmbeddedEngine {
    fn submit(&self, request: GenerationRequest) -> Result<PendingGeneration, EngineError> {
        request.sampling.validate()?;
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.config.requests_max {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::QueueFull {
                capacity: self.config.requests_max,
            });
        }
        let (reply, receiver) = mpsc::channel();
        let cancel = CancelToken::default();
        let sent = self.send(Input::Generate {
            request,
            cancel: cancel.clone(),
            reply,
        });
        if let Err(error) = sent {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(error);
        }
        Ok(PendingGeneration::new(receiver, cancel))
    }

    fn update_weights(&self, update: WeightUpdate) -> Result<PolicyVersion, EngineError> {
        let (reply, receiver) = mpsc::channel();
        self.send(Input::UpdateWeights { update, reply })?;
        receiver.recv().unwrap_or(Err(EngineError::Stopped))
    }

    fn abort_all(&self) -> Result<usize, EngineError> {
        let (reply, receiver) = mpsc::channel();
        self.send(Input::AbortAll { reply })?;
        receiver.recv().map_err(|_| EngineError::Stopped)
    }

    fn policy_version(&self) -> PolicyVersion {
        PolicyVersion(self.version.load(Ordering::Acquire))
    }
}

impl Drop for EmbeddedEngine {
    fn drop(&mut self) {
        // A full queue still drains: the worker keeps receiving until it sees Shutdown.
        let _ = self.inputs.send(Input::Shutdown);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

struct Worker {
    policy: Policy,
    version: PolicyVersion,
    config: EngineConfig,
    shared_version: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
    batch: DecodeBatch,
    waiting: VecDeque<(u64, GenerationRequest, CancelToken)>,
    replies: BTreeMap<u64, Reply>,
    /// The update waiting for the batch to drain, and the first ticket submitted after it.
    pending_update: Option<PendingUpdate>,
    next_ticket: u64,
}

impl Worker {
    fn run(mut self, inputs: Receiver<Input>) {
        loop {
            let idle =
                self.batch.is_empty() && self.waiting.is_empty() && self.pending_update.is_none();
            let first = if idle {
                match inputs.recv() {
                    Ok(input) => Some(input),
                    Err(_) => return,
                }
            } else {
                None
            };
            let mut next = first;
            loop {
                let input = match next.take() {
                    Some(input) => input,
                    None => match inputs.try_recv() {
                        Ok(input) => input,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => return,
                    },
                };
                if !self.handle(input) {
                    self.abort_everything();
                    return;
                }
            }
            self.apply_update_when_drained();
            self.admit_waiting();
            if !self.batch.is_empty() {
                match self.batch.step(&self.policy) {
                    Ok(finished) => self.reply_all(finished),
                    Err(error) => self.fail_all(&error),
                }
            }
        }
    }

    /// Returns false on shutdown.
    fn handle(&mut self, input: Input) -> bool {
        match input {
            Input::Generate {
                request,
                cancel,
                reply,
            } => {
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                self.replies.insert(ticket, reply);
                self.waiting.push_back((ticket, request, cancel));
            }
            Input::UpdateWeights { update, reply } => {
                let barrier = self.next_ticket;
                if let Some((_, previous, _)) =
                    self.pending_update.replace((update, reply, barrier))
                {
                    // A newer update supersedes one not yet applied.
                    let _ = previous.send(Err(EngineError::Aborted));
                }
            }
            Input::AbortAll { reply } => {
                let count = self.abort_everything();
                let _ = reply.send(count);
            }
            Input::Shutdown => return false,
        }
        true
    }

    fn abort_everything(&mut self) -> usize {
        let mut aborted = self.batch.abort_all();
        aborted.extend(
            self.waiting
                .drain(..)
                .map(|(ticket, _, _)| (ticket, Err(EngineError::Aborted))),
        );
        let count = aborted.len();
        self.reply_all(aborted);
        count
    }

    fn apply_update_when_drained(&mut self) {
        let Some((_, _, barrier)) = &self.pending_update else {
            return;
        };
        let older_waiting = self
            .waiting
            .front()
            .is_some_and(|(ticket, _, _)| ticket < barrier);
        if !self.batch.is_empty() || older_waiting {
            return;
        }
        let Some((update, reply, _)) = self.pending_update.take() else {
            return;
        };
        let result = self
            .policy
            .import_weights(&update.manifest, &update.buffer)
            .map(|()| update.version)
            .map_err(|error| match error {
                ModelError::Engine(error) => error,
                other => EngineError::InvalidWeights {
                    message: other.to_string(),
                },
            });
        if let Ok(version) = result {
            self.version = version;
            self.shared_version.store(version.get(), Ordering::Release);
            self.batch = DecodeBatch::new(version, self.config.kv_cache);
        }
        let _ = reply.send(result);
    }

    fn admit_waiting(&mut self) {
        let barrier = self.pending_update.as_ref().map(|(_, _, barrier)| *barrier);
        while self.batch.len() < self.config.batch_max {
            let after_barrier = self
                .waiting
                .front()
                .is_some_and(|(ticket, _, _)| barrier.is_some_and(|barrier| *ticket >= barrier));
            if after_barrier {
                break;
            }
            let Some((ticket, request, cancel)) = self.waiting.pop_front() else {
                break;
            };
            if cancel.is_cancelled() {
                self.reply_all(vec![(ticket, Err(EngineError::Aborted))]);
                continue;
            }
            match self.batch.admit(&self.policy, ticket, request, cancel) {
                Ok(Some(finished)) => self.reply_all(vec![finished]),
                Ok(None) => {}
                Err(error) => self.reply_all(vec![(
                    ticket,
                    Err(EngineError::Backend {
                        message: error.to_string(),
                    }),
                )]),
            }
        }
    }

    fn reply_all(&mut self, finished: Vec<Finished>) {
        for (ticket, result) in finished {
            if let Some(reply) = self.replies.remove(&ticket) {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                // The caller may have dropped its pending handle; nothing to do then.
                let _ = reply.send(result);
            }
        }
    }

    fn fail_all(&mut self, error: &ModelError) {
        let tickets: Vec<u64> = self.replies.keys().copied().collect();
        let message = error.to_string();
        self.batch = DecodeBatch::new(self.version, self.config.kv_cache);
        self.waiting.clear();
        self.reply_all(
            tickets
                .into_iter()
                .map(|ticket| {
                    (
                        ticket,
                        Err(EngineError::Backend {
                            message: message.clone(),
                        }),
                    )
                })
                .collect(),
        );
    }
}
