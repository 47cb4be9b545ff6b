//! [`DecodeBatch`]: several sequences decoding together, one token per step.
//!
//! Each sequence owns its KV cache and its sampling stream; a step samples one token for every
//! active sequence from its pending logits, then runs one batched decode for those that go on.
//! Sequences join (prefill) and leave (stop, length, context, cancel) between steps, which is
//! what lets the engine admit new requests while others are mid-generation.

use candle_core::Tensor;
use gyre_engine::{CancelToken, EngineError, FinishReason, Generation, GenerationRequest};
use gyre_event::PolicyVersion;
use gyre_trajectory::SplitMix64;

use crate::sampler::sample_token;
use crate::transformer::KvCache;
use crate::{ModelError, Policy};

/// One finished (or aborted) sequence: its ticket and result.
pub type Finished = (u64, Result<Generation, EngineError>);

struct Sequence {
    ticket: u64,
    request: GenerationRequest,
    cancel: CancelToken,
    rng: SplitMix64,
    cache: KvCache,
    output_ids: Vec<u32>,
    output_logprobs: Vec<f32>,
    next_logits: Vec<f32>,
}

impl Sequence {
    fn tokens(&self) -> Vec<u32> {
        let mut tokens = self.request.prompt.clone();
        tokens.extend_from_slice(&self.output_ids);
        tokens
    }
}

/// Sequences decoding together under one policy version.
pub struct DecodeBatch {
    version: PolicyVersion,
    kv_cache: bool,
    sequences: Vec<Sequence>,
}

impl DecodeBatch {
    /// `kv_cache = false` recomputes every sequence from scratch at each step (the baseline).
    pub fn new(version: PolicyVersion, kv_cache: bool) -> Self {
        Self {
            version,
            kv_cache,
            sequences: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.sequences.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    pub fn version(&self) -> PolicyVersion {
        self.version
    }

    /// Checks a request against the model; the rejection is a value.
    pub fn check(policy: &Policy, request: &GenerationRequest) -> Result<(), EngineError> {
        request.sampling.validate()?;
        let config = policy.config();
        if request.prompt.is_empty() {
            return Err(EngineError::InvalidRequest {
                field: "prompt",
                message: "must hold at least one token".into(),
            });
        }
        if request.prompt.len() >= config.context_tokens_max {
            return Err(EngineError::InvalidRequest {
                field: "prompt",
                message: format!(
                    "{} tokens leave no room in a context of {}",
                    request.prompt.len(),
                    config.context_tokens_max
                ),
            });
        }
        if let Some(token) = request
            .prompt
            .iter()
            .find(|&&token| token as usize >= config.vocab_size)
        {
            return Err(EngineError::InvalidRequest {
                field: "prompt",
                message: format!(
                    "token {token} is outside the vocabulary of {}",
                    config.vocab_size
                ),
            });
        }
        Ok(())
    }

    /// Prefills `request` and adds it; a rejected request finishes at once.
    pub fn admit(
        &mut self,
        policy: &Policy,
        ticket: u64,
        request: GenerationRequest,
        cancel: CancelToken,
    ) -> Result<Option<Finished>, ModelError> {
        if let Err(error) = Self::check(policy, &request) {
            return Ok(Some((ticket, Err(error))));
        }
        let mut cache = KvCache::default();
        let model = policy.inference();
        let logits = if self.kv_cache {
            model.prefill(&request.prompt, &mut cache)?
        } else {
            model.last_logits_uncached(&[&request.prompt])?.squeeze(0)?
        };
        let rng = SplitMix64::new(request.sampling.seed);
        self.sequences.push(Sequence {
            ticket,
            request,
            cancel,
            rng,
            cache,
            output_ids: Vec::new(),
            output_logprobs: Vec::new(),
            next_logits: logits.to_vec1::<f32>()?,
        });
        Ok(None)
    }

    /// Aborts every sequence.
    pub fn abort_all(&mut self) -> Vec<Finished> {
        self.sequences
            .drain(..)
            .map(|sequence| (sequence.ticket, Err(EngineError::Aborted)))
            .collect()
    }

    /// Samples one token for every sequence and decodes the ones that continue. Returns the
    /// sequences that finished in this step.
    pub fn step(&mut self, policy: &Policy) -> Result<Vec<Finished>, ModelError> {
        let context_max = policy.config().context_tokens_max;
        let mut finished = Vec::new();
        let mut continuing = Vec::with_capacity(self.sequences.len());
        for mut sequence in std::mem::take(&mut self.sequences) {
            if sequence.cancel.is_cancelled() {
                finished.push((sequence.ticket, Err(EngineError::Aborted)));
                continue;
            }
            let sampling = &sequence.request.sampling;
            let reason = if sequence.output_ids.len() >= sampling.new_tokens_max as usize {
                Some(FinishReason::Length)
            } else {
                let (token, logprob) =
                    sample_token(&sequence.next_logits, sampling, &mut sequence.rng);
                sequence.output_ids.push(token);
                sequence.output_logprobs.push(logprob);
                if sampling.stop_tokens.contains(&token) {
                    Some(FinishReason::Stop)
                } else if sequence.output_ids.len() >= sampling.new_tokens_max as usize {
                    Some(FinishReason::Length)
                } else if sequence.request.prompt.len() + sequence.output_ids.len() >= context_max {
                    Some(FinishReason::Context)
                } else {
                    None
                }
            };
            match reason {
                Some(finish_reason) => finished.push((
                    sequence.ticket,
                    Ok(Generation {
                        output_ids: sequence.output_ids,
                        output_logprobs: sequence.output_logprobs,
                        policy_version: self.version,
                        finish_reason,
                    }),
                )),
                None => continuing.push(sequence),
            }
        }
        if !continuing.is_empty() {
            let model = policy.inference();
            let logits = if self.kv_cache {
                let tokens: Vec<u32> = continuing
                    .iter()
                    .map(|sequence| {
                        *sequence
                            .output_ids
                            .last()
                            .expect("a continuing sequence sampled a token")
                    })
                    .collect();
                let mut caches: Vec<&mut KvCache> = continuing
                    .iter_mut()
                    .map(|sequence| &mut sequence.cache)
                    .collect();
                model.decode(&tokens, &mut caches)?
            } else {
                let all: Vec<Vec<u32>> = continuing.iter().map(Sequence::tokens).collect();
                let views: Vec<&[u32]> = all.iter().map(Vec::as_slice).collect();
                model.last_logits_uncached(&views)?
            };
            let rows = split_rows(&logits)?;
            for (sequence, row) in continuing.iter_mut().zip(rows) {
                sequence.next_logits = row;
            }
        }
        self.sequences = continuing;
        Ok(finished)
    }
}

fn split_rows(logits: &Tensor) -> Result<Vec<Vec<f32>>, ModelError> {
    Ok(logits.to_vec2::<f32>()?)
}

/// Runs `requests` to completion together (tickets are their indices) and returns the results
/// in request order.
pub fn generate(
    policy: &Policy,
    version: PolicyVersion,
    requests: Vec<GenerationRequest>,
    kv_cache: bool,
) -> Result<Vec<Result<Generation, EngineError>>, ModelError> {
    let count = requests.len();
    let mut results: Vec<Option<Result<Generation, EngineError>>> = vec![None; count];
    let mut batch = DecodeBatch::new(version, kv_cache);
    for (ticket, request) in requests.into_iter().enumerate() {
        if let Some((ticket, result)) =
            batch.admit(policy, ticket as u64, request, CancelToken::default())?
        {
            results[ticket as usize] = Some(result);
        }
    }
    while !batch.is_empty() {
        for (ticket, result) in batch.step(policy)? {
            results[ticket as usize] = Some(result);
        }
    }
    Ok(results
        .into_iter()
        .map(|result| result.expect("every admitted request finishes"))
        .collect())
}
