//! The deterministic engine: a fixed-length pseudo-random output that depends only on the
//! prompt, for benchmarks (a stand-in engine whose cost is negligible and identical whether it
//! is called directly or through a proxy or gateway) and as a simple backend for the fakes.

use std::ops::Range;
use std::sync::Arc;

use super::playback::{Output, Player};
use super::scripted::apply_limits;
use super::{
    BoxFuture, ChunkStream, EngineFailure, EngineRequest, Fault, PlaybackOptions, TokenEngine,
};

/// Options of a [`DeterministicEngine`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeterministicOptions {
    /// [`TokenEngine::name`].
    pub name: String,
    /// Output length before `max_new_tokens` and stop ids apply.
    pub output_tokens: u32,
    /// If set, the last output id is this (an end-of-turn token), so the output ends with
    /// `Stop` when it fits.
    pub end_token_id: Option<u32>,
    /// Ids are drawn from this range (keep special tokens out of it). Must not be empty.
    pub vocabulary: Range<u32>,
    pub playback: PlaybackOptions,
    pub fault: Option<Fault>,
    /// The policy version every answer (and abort) reports.
    pub policy_version: u64,
}

impl Default for DeterministicOptions {
    /// 16 tokens from the test model's ordinary ids (9..2048), no end token.
    fn default() -> Self {
        Self {
            name: "deterministic".into(),
            output_tokens: 16,
            end_token_id: None,
            vocabulary: 9..2048,
            playback: PlaybackOptions::default(),
            fault: None,
            policy_version: 0,
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct DeterministicEngine {
    player: Arc<Player>,
    options: Arc<DeterministicOptions>,
}

impl DeterministicEngine {
    pub fn new(options: DeterministicOptions) -> Self {
        assert!(
            !options.vocabulary.is_empty(),
            "the deterministic engine needs a non-empty vocabulary"
        );
        Self {
            player: Arc::new(Player::new(
                options.name.clone(),
                options.playback.clone(),
                options.fault,
            )),
            options: Arc::new(options),
        }
    }

    /// Queues a fault for the next request.
    pub fn inject(&self, fault: Fault) {
        self.player.inject(fault);
    }

    /// The full output for `input_ids` (before limits).
    pub fn output_for(&self, input_ids: &[u32]) -> Vec<u32> {
        output_for(&self.options, input_ids)
    }

    /// Requests streaming now.
    pub fn in_flight_count(&self) -> usize {
        self.player.in_flight_count()
    }

    /// Resolves once no request is in flight.
    pub async fn wait_idle(&self) {
        self.player.wait_idle().await;
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn output_for(options: &DeterministicOptions, input_ids: &[u32]) -> Vec<u32> {
    // The prompt length and its last 16 ids seed the output: O(1) per request, however long
    // the context.
    let tail = &input_ids[input_ids.len().saturating_sub(16)..];
    let seed = tail.iter().fold(mix(input_ids.len() as u64), |hash, &id| {
        mix(hash ^ u64::from(id))
    });
    let span = u64::from(options.vocabulary.end - options.vocabulary.start);
    let count = options.output_tokens as usize;
    let mut ids: Vec<u32> = (0..count as u64)
        .map(|position| {
            let offset = mix(seed ^ position) % span;
            options.vocabulary.start + u32::try_from(offset).expect("offset < span fits in u32")
        })
        .collect();
    if let (Some(end), Some(last)) = (options.end_token_id, ids.last_mut()) {
        *last = end;
    }
    ids
}

impl TokenEngine for DeterministicEngine {
    fn name(&self) -> &str {
        self.player.name()
    }

    fn generate(
        &self,
        request: EngineRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        let player = Arc::clone(&self.player);
        let options = Arc::clone(&self.options);
        Box::pin(async move {
            if request.input_ids.is_empty() {
                return Err(EngineFailure::Rejected {
                    engine: player.name().to_string(),
                    message: "input_ids is empty".into(),
                });
            }
            let (ids, finish) = apply_limits(&output_for(&options, &request.input_ids), &request);
            let output = Output {
                ids,
                finish,
                policy_version: options.policy_version,
            };
            player.start(request.rid, output, Box::new(|_| {}))
        })
    }

    fn abort(&self, rid: &str) -> BoxFuture<'static, Result<(), EngineFailure>> {
        self.player.abort(rid);
        Box::pin(async { Ok(()) })
    }

    fn health(&self) -> BoxFuture<'static, Result<(), EngineFailure>> {
        Box::pin(async { Ok(()) })
    }
}
