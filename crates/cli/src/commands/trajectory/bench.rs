//! `gyre trajectory bench`: figures for docs/benchmarks.md (STYLE rule 14: benchmarks are
//! commands, not tests).
//!
//! 1. Build + admit on a synthetic Appendix-C-sized execution (≈636 calls, ≈1.3k segments,
//!    ≈1M lifecycle tokens): applying the incremental records (what the log holds) and admitting
//!    J_max = 5; median over repetitions.
//! 2. Matcher cost per call vs context length: the full-context matcher (compares the reused
//!    prefix, memcmp-speed) and the anchored incremental path the proxy uses (O(new tokens)).
//! 3. Packing: padding fraction of first-fit-decreasing micro-steps vs one row per micro-step.

use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::Args;
use gyre_event::{ExecutionId, ModelCallRecord};
use gyre_trajectory::synthetic::{context_call, Generator, SyntheticConfig};
use gyre_trajectory::{
    admit, match_context, match_extension, materialise, pack_rows, padding_fraction,
    record_from_context, statistics, RoleClasses, SplitMix64, Tree, TreeConfig,
};

#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct BenchArgs {
    /// Repetitions of each timed section (the median is printed).
    #[arg(long, default_value_t = 15)]
    repetitions: u32,
    /// Seed of the synthetic execution.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Micro-step token budget for the packing figure: at least the longest admitted row
    /// (refused otherwise).
    #[arg(
        long = "tokens-max",
        default_value_t = 262_144,
        value_parser = clap::value_parser!(u64).range(1..),
    )]
    tokens_max: u64,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

struct MatcherSample {
    context_tokens: u64,
    new_tokens: u64,
    full_ns: f64,
    incremental_ns: f64,
}

/// Generates the execution, records its incremental records and times the matcher per call.
fn generate(seed: u64, repetitions: u32) -> Result<(Vec<ModelCallRecord>, Vec<MatcherSample>)> {
    let mut tree = Tree::new(ExecutionId(seed), TreeConfig::default());
    let mut records = Vec::new();
    let mut samples = Vec::new();
    let mut failure = None;
    Generator::new(SyntheticConfig::appendix_c(), seed, |call| {
        if failure.is_some() {
            return;
        }
        let view = context_call(&call);
        let mut full = Vec::new();
        let mut found = None;
        for _ in 0..repetitions.clamp(1, 5) {
            let started = Instant::now();
            found = Some(match_context(&tree, view.context));
            full.push(started.elapsed().as_nanos() as f64);
        }
        let found = found.expect("at least one repetition");
        let mut incremental = Vec::new();
        for _ in 0..repetitions.clamp(1, 5) {
            let started = Instant::now();
            let anchored = found
                .parent_call
                .map(|anchor| match_extension(&tree, anchor, found.reused_tokens_count));
            // The anchored path also copies the new suffix into the record, as the proxy would.
            let suffix = view.context[found.reused_tokens_count as usize..].to_vec();
            std::hint::black_box((anchored, suffix));
            incremental.push(started.elapsed().as_nanos() as f64);
        }
        let record = record_from_context(&tree, &view);
        samples.push(MatcherSample {
            context_tokens: call.context.len() as u64,
            new_tokens: record.input_ids.len() as u64,
            full_ns: median(full),
            incremental_ns: median(incremental),
        });
        match tree.apply(&record) {
            Ok(_) => records.push(record),
            Err(error) => failure = Some(error),
        }
    })
    .run();
    if let Some(error) = failure {
        return Err(anyhow!("synthetic execution did not apply: {error}"));
    }
    Ok((records, samples))
}

/// The lengths of the rows the packing figure packs: J_max = 5 admitted rows of each of 8
/// small synthetic executions (a group).
fn packing_lengths(classes: &RoleClasses) -> Result<Vec<u64>> {
    let mut lengths = Vec::new();
    for seed in 0..8u64 {
        let mut small = Tree::new(ExecutionId(seed), TreeConfig::default());
        let mut config = SyntheticConfig::appendix_c();
        config.main_calls = 120;
        config.sub_agent_calls = 30;
        let mut failure = None;
        Generator::new(config, 100 + seed, |call| {
            let record = record_from_context(&small, &context_call(&call));
            if let Err(error) = small.apply(&record) {
                failure = Some(error);
            }
        })
        .run();
        if let Some(error) = failure {
            return Err(anyhow!("{error}"));
        }
        let admission = admit(&small, classes, 5, &mut SplitMix64::for_execution(7, seed));
        for trajectory in &admission.trajectories {
            lengths.push(
                materialise(&small, trajectory, 0.0, 0.0)
                    .map_err(|error| anyhow!("{error}"))?
                    .len(),
            );
        }
    }
    Ok(lengths)
}

pub fn run(args: BenchArgs) -> Result<()> {
    let repetitions = args.repetitions.max(1);
    let classes = RoleClasses::claude_code();
    // The rows are fixed (their seeds are), so a budget no row fits is refused before anything
    // is timed rather than silently raised.
    let lengths = packing_lengths(&classes)?;
    let longest = lengths.iter().copied().max().unwrap_or(0);
    if args.tokens_max < longest {
        return Err(anyhow!(
            "--tokens-max {} is below the longest packed row ({longest} tokens)",
            args.tokens_max
        ));
    }
    let (records, samples) = generate(args.seed, repetitions)?;
    let execution = ExecutionId(args.seed);

    // 1. Build + admit.
    let mut build_ms = Vec::new();
    let mut admit_ms = Vec::new();
    let mut tree = Tree::new(execution, TreeConfig::default());
    for _ in 0..repetitions {
        let started = Instant::now();
        tree = Tree::new(execution, TreeConfig::default());
        for record in &records {
            tree.apply(record).map_err(|error| anyhow!("{error}"))?;
        }
        build_ms.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let admission = admit(
            &tree,
            &classes,
            5,
            &mut SplitMix64::for_execution(7, execution.get()),
        );
        std::hint::black_box(&admission);
        admit_ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let stats = statistics(&tree, &classes);
    let admission = admit(
        &tree,
        &classes,
        5,
        &mut SplitMix64::for_execution(7, execution.get()),
    );
    let full_context_tokens: u64 = samples.iter().map(|sample| sample.context_tokens).sum();
    outln!(
        "== build + admit (synthetic Appendix C execution, seed {}) ==",
        args.seed
    );
    outln!(
        "calls {}  nodes {}  segments {}  roots {}  leaves {}  lifecycle tokens {}  trainable {}",
        stats.requests,
        stats.nodes,
        stats.segments,
        stats.roots,
        stats.leaves,
        stats.tokens_tree,
        stats.trainable_tokens
    );
    outln!(
        "node occurrences unrolled {} vs tree {} ({} repeated); segments unrolled {} vs {}",
        stats.node_occurrences_unrolled,
        stats.node_occurrences_tree,
        stats.node_occurrences_repeated(),
        stats.segment_occurrences_unrolled,
        stats.segments
    );
    outln!("full contexts sent by the harness over the execution: {full_context_tokens} tokens");
    outln!(
        "admitted {} trajectories, L_i = {}",
        admission.trajectories.len(),
        admission.targets_count
    );
    let build = median(build_ms);
    let admit_time = median(admit_ms);
    outln!("{:<34} {:>10}", "section", "median ms");
    outln!(
        "{:<34} {:>10.3}",
        format!("build (apply {} records)", records.len()),
        build
    );
    outln!("{:<34} {:>10.3}", "admit (J_max = 5)", admit_time);
    outln!(
        "{:<34} {:>10.3}  (goal ≤ 10 ms)",
        "build + admit",
        build + admit_time
    );
    outln!();

    // 2. Matcher cost per call vs context length.
    outln!("== matcher cost per call vs context length ==");
    outln!(
        "{:<18} {:>6} {:>12} {:>14} {:>16} {:>18}",
        "context tokens",
        "calls",
        "new tokens",
        "full µs/call",
        "full ns/ctx tok",
        "incremental µs"
    );
    let buckets: [(u64, u64); 6] = [
        (0, 10_000),
        (10_000, 25_000),
        (25_000, 50_000),
        (50_000, 100_000),
        (100_000, 150_000),
        (150_000, u64::MAX),
    ];
    for (low, high) in buckets {
        let bucket: Vec<&MatcherSample> = samples
            .iter()
            .filter(|sample| sample.context_tokens >= low && sample.context_tokens < high)
            .collect();
        if bucket.is_empty() {
            continue;
        }
        let label = if high == u64::MAX {
            format!("≥{}k", low / 1000)
        } else {
            format!("{}k–{}k", low / 1000, high / 1000)
        };
        let full = median(bucket.iter().map(|sample| sample.full_ns).collect());
        let per_token = median(
            bucket
                .iter()
                .map(|sample| sample.full_ns / sample.context_tokens.max(1) as f64)
                .collect(),
        );
        let incremental = median(bucket.iter().map(|sample| sample.incremental_ns).collect());
        let new_tokens = median(
            bucket
                .iter()
                .map(|sample| sample.new_tokens as f64)
                .collect(),
        );
        outln!(
            "{:<18} {:>6} {:>12.0} {:>14.1} {:>16.3} {:>18.2}",
            label,
            bucket.len(),
            new_tokens,
            full / 1e3,
            per_token,
            incremental / 1e3
        );
    }
    outln!();

    // 3. Packing: the admitted rows of 8 executions (a group) packed vs one row per micro-step.
    outln!(
        "== packing (8 executions × J_max 5 admitted rows, tokens_max {}) ==",
        args.tokens_max
    );
    let tokens_max = args.tokens_max;
    let bins = pack_rows(&lengths, tokens_max).map_err(|error| anyhow!("{error}"))?;
    let total: u64 = lengths.iter().sum();
    outln!(
        "{:<28} {:>12} {:>18}",
        "packing",
        "micro-steps",
        "padding fraction"
    );
    outln!(
        "{:<28} {:>12} {:>18.3}",
        "first-fit decreasing",
        bins.len(),
        padding_fraction(total, bins.len() as u64, tokens_max)
    );
    outln!(
        "{:<28} {:>12} {:>18.3}",
        "one row per micro-step",
        lengths.len(),
        padding_fraction(total, lengths.len() as u64, tokens_max)
    );
    outln!(
        "rows {}  tokens {}  longest row {}",
        lengths.len(),
        total,
        lengths.iter().max().unwrap_or(&0)
    );
    Ok(())
}
