//! Prometheus metrics of the proxy, rendered by hand in the text exposition format (a handful of
//! counters and histograms do not need a metrics crate).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::messages::Api;

/// Histogram bucket upper bounds, seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, value: f64) {
        for (bound, count) in BUCKETS.iter().zip(self.counts.iter_mut()) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        self.render_series(name, "", out);
    }

    /// The series without the HELP / TYPE lines; `labels` (`stage="parse",`) go before `le`.
    fn render_series(&self, name: &str, labels: &str, out: &mut String) {
        for (bound, count) in BUCKETS.iter().zip(self.counts.iter()) {
            out.push_str(&format!(
                "{name}_bucket{{{labels}le=\"{bound}\"}} {count}\n"
            ));
        }
        out.push_str(&format!(
            "{name}_bucket{{{labels}le=\"+Inf\"}} {}\n",
            self.count
        ));
        let braces = labels.trim_end_matches(',');
        let labelled = if braces.is_empty() {
            String::new()
        } else {
            format!("{{{braces}}}")
        };
        out.push_str(&format!(
            "{name}_sum{labelled} {}\n{name}_count{labelled} {}\n",
            self.sum, self.count
        ));
    }
}

/// The steps of a model call timed in `gyre_proxy_stage_seconds`, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for a preparing slot (one per core) and the blocking pool.
    Wait,
    /// Parsing the request body.
    Parse,
    /// Restoring cached outputs, rendering the template, tokenizing the new tail, matching the
    /// tree.
    Prepare,
    /// From the first engine request to the end of the answer (retries included).
    Engine,
}

const STAGES: [(Stage, &str); 4] = [
    (Stage::Wait, "wait"),
    (Stage::Parse, "parse"),
    (Stage::Prepare, "prepare"),
    (Stage::Engine, "engine"),
];

#[derive(Default)]
pub struct Metrics {
    requests: [AtomicU64; 3],
    rejected_4xx: AtomicU64,
    rejected_5xx: AtomicU64,
    recorded: AtomicU64,
    tokens_encoded: AtomicU64,
    tokens_reused: AtomicU64,
    failovers: AtomicU64,
    harness_gone: AtomicU64,
    sampling_overridden: AtomicU64,
    context_too_long: AtomicU64,
    responses_given_up: AtomicU64,
    threads_given_up: AtomicU64,
    responses_read_back: AtomicU64,
    threads_read_back: AtomicU64,
    replayed: AtomicU64,
    stream_errors: AtomicU64,
    body_elements_parsed: AtomicU64,
    body_elements_reused: AtomicU64,
    connections_open: AtomicU64,
    connections_refused: AtomicU64,
    websockets_open: AtomicU64,
    call_seconds: Mutex<Histogram>,
    commit_seconds: Mutex<Histogram>,
    stage_seconds: Mutex<[Histogram; STAGES.len()]>,
    /// Every observation of every stage and of `commit`, in that order, while switched on by
    /// [`Metrics::keep_samples`]: for a report of each stage's tail (the buckets above are too
    /// coarse for a p99 of a fraction of a millisecond). Off in a serving proxy.
    samples: Mutex<Option<Vec<Vec<f64>>>>,
}

fn api_index(api: Api) -> usize {
    match api {
        Api::Anthropic => 0,
        Api::OpenAiChat => 1,
        Api::OpenAiResponses => 2,
    }
}

impl Metrics {
    pub fn request(&self, api: Api) {
        self.requests[api_index(api)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self, status: u16) {
        if status >= 500 {
            self.rejected_5xx.fetch_add(1, Ordering::Relaxed);
        } else {
            self.rejected_4xx.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A client connection was accepted and is being served.
    pub fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A connection over `--max-connections`: answered "overloaded" and closed, or dropped.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A Responses WebSocket was opened (its HTTP connection was handed over to it).
    pub fn websocket_opened(&self) {
        self.websockets_open.fetch_add(1, Ordering::Relaxed);
    }

    pub fn websocket_closed(&self) {
        self.websockets_open.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn websockets_open(&self) -> u64 {
        self.websockets_open.load(Ordering::Relaxed)
    }

    pub fn connections_open(&self) -> u64 {
        self.connections_open.load(Ordering::Relaxed)
    }

    pub fn connections_refused(&self) -> u64 {
        self.connections_refused.load(Ordering::Relaxed)
    }

    pub fn recorded(&self, encoded: u64, reused: u64, seconds: f64) {
        self.recorded.fetch_add(1, Ordering::Relaxed);
        self.tokens_encoded.fetch_add(encoded, Ordering::Relaxed);
        self.tokens_reused.fetch_add(reused, Ordering::Relaxed);
        self.call_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(seconds);
    }

    pub fn commit_seconds(&self, seconds: f64) {
        self.commit_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(seconds);
        self.sample(STAGES.len(), seconds);
    }

    /// One call spent `seconds` in `stage`.
    pub fn stage(&self, stage: Stage, seconds: f64) {
        let index = STAGES
            .iter()
            .position(|(known, _)| *known == stage)
            .unwrap_or(0);
        self.stage_seconds.lock().unwrap_or_else(|p| p.into_inner())[index].observe(seconds);
        self.sample(index, seconds);
    }

    fn sample(&self, index: usize, seconds: f64) {
        if let Some(samples) = self
            .samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            samples[index].push(seconds);
        }
    }

    /// Starts keeping every stage observation (dropping any kept so far); `stage_samples`
    /// returns them. A benchmark switches this on; memory grows with every call.
    pub fn keep_samples(&self) {
        *self.samples.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(vec![Vec::new(); STAGES.len() + 1]);
    }

    /// (stage, every observation in seconds) for every stage and then `commit`, since
    /// `keep_samples`; empty when samples are not kept.
    pub fn stage_samples(&self) -> Vec<(&'static str, Vec<f64>)> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let Some(samples) = samples.as_ref() else {
            return Vec::new();
        };
        STAGES
            .iter()
            .map(|(_, label)| *label)
            .chain(["commit"])
            .zip(samples.iter().cloned())
            .collect()
    }

    /// (stage, seconds summed, calls) for every stage and then `commit`: what the stage
    /// histograms hold, for a report (the benchmark prints the per-call means of a run).
    pub fn stage_totals(&self) -> Vec<(&'static str, f64, u64)> {
        let stages = self.stage_seconds.lock().unwrap_or_else(|p| p.into_inner());
        let mut totals: Vec<_> = STAGES
            .iter()
            .zip(stages.iter())
            .map(|((_, label), histogram)| (*label, histogram.sum, histogram.count))
            .collect();
        let commit = self
            .commit_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        totals.push(("commit", commit.sum, commit.count));
        totals
    }

    pub fn failover(&self) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
    }

    pub fn harness_gone(&self) {
        self.harness_gone.fetch_add(1, Ordering::Relaxed);
    }

    /// A call whose harness asked for its own sampling settings, sampled with the policy's.
    pub fn sampling_overridden(&self) {
        self.sampling_overridden.fetch_add(1, Ordering::Relaxed);
    }

    /// A call refused because its prompt leaves the context window no room for an answer.
    pub fn context_too_long(&self) {
        self.context_too_long.fetch_add(1, Ordering::Relaxed);
    }

    /// Stored responses dropped from memory to make room in the response store.
    pub fn responses_given_up(&self, count: usize) {
        self.responses_given_up
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    /// A held Message Thread given up to make room in the thread store.
    pub fn threads_given_up(&self) {
        self.threads_given_up_by(1);
    }

    /// `count` threads given up to an execution's own limits.
    pub fn threads_given_up_by(&self, count: u64) {
        self.threads_given_up.fetch_add(count, Ordering::Relaxed);
    }

    /// A Message Thread a client continued, read back from the log (it was no longer held).
    pub fn thread_read_back(&self) {
        self.threads_read_back.fetch_add(1, Ordering::Relaxed);
    }

    /// A stored response a client named, read back from the log (it was no longer in memory).
    pub fn response_read_back(&self) {
        self.responses_read_back.fetch_add(1, Ordering::Relaxed);
    }

    /// A call answered with its committed answer again (a harness re-sent it).
    pub fn replayed(&self) {
        self.replayed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn replayed_count(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    pub fn stream_error(&self) {
        self.stream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A body's conversation elements: `reused` taken over from the agent's previous body,
    /// the rest parsed.
    pub fn body_elements(&self, total: usize, reused: usize) {
        self.body_elements_reused
            .fetch_add(reused as u64, Ordering::Relaxed);
        self.body_elements_parsed
            .fetch_add(total.saturating_sub(reused) as u64, Ordering::Relaxed);
    }

    /// Calls recorded so far.
    pub fn recorded_count(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    pub fn failovers_count(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP gyre_proxy_requests_total Model-API requests received (count_tokens included), by API.\n# TYPE gyre_proxy_requests_total counter\n");
        for (api, name) in ["anthropic", "openai_chat", "openai_responses"]
            .iter()
            .enumerate()
        {
            out.push_str(&format!(
                "gyre_proxy_requests_total{{api=\"{name}\"}} {}\n",
                self.requests[api].load(Ordering::Relaxed)
            ));
        }
        let counters = [
            (
                "gyre_proxy_rejected_total{class=\"4xx\"}",
                "Requests answered with an error, by class.",
                &self.rejected_4xx,
            ),
            (
                "gyre_proxy_rejected_total{class=\"5xx\"}",
                "",
                &self.rejected_5xx,
            ),
            (
                "gyre_proxy_calls_recorded_total",
                "Model calls whose TITO record was committed.",
                &self.recorded,
            ),
            (
                "gyre_proxy_tokens_encoded_total",
                "Prompt tokens the proxy tokenized.",
                &self.tokens_encoded,
            ),
            (
                "gyre_proxy_tokens_reused_total",
                "Prompt tokens reused from the execution's previous context.",
                &self.tokens_reused,
            ),
            (
                "gyre_proxy_engine_failovers_total",
                "Engine failures or aborts continued on another engine.",
                &self.failovers,
            ),
            (
                "gyre_proxy_harness_disconnects_total",
                "Calls whose harness went away before the answer ended.",
                &self.harness_gone,
            ),
            (
                "gyre_proxy_sampling_overridden_total",
                "Calls whose harness asked for its own temperature, top_p or top_k, sampled with \
                 the policy's own settings instead (`--sampling policy`).",
                &self.sampling_overridden,
            ),
            (
                "gyre_proxy_context_too_long_total",
                "Calls refused because their prompt leaves the context window \
                 (`--context-tokens-max`) no room for an answer; the harness is told in its API's \
                 words and compacts.",
                &self.context_too_long,
            ),
            (
                "gyre_proxy_responses_given_up_total",
                "Stored Responses answers dropped from memory to make room in the response store \
                 (`--response-store-mib`); those the log holds are read back when named.",
                &self.responses_given_up,
            ),
            (
                "gyre_proxy_threads_given_up_total",
                "Anthropic Message Threads given up to make room, in the thread store \
                 (`--thread-store-mib`) or within an execution's own limits (16 threads, \
                 64 MiB); a later continue of one reads it back from the log.",
                &self.threads_given_up,
            ),
            (
                "gyre_proxy_threads_read_back_total",
                "Anthropic Message Threads a client continued (or counted the tokens of a \
                 continue of) after they left memory (given up for room, or older than a \
                 restart held again), read back from the log.",
                &self.threads_read_back,
            ),
            (
                "gyre_proxy_responses_read_back_total",
                "Stored Responses answers a client named after they left memory, read back from \
                 the log.",
                &self.responses_read_back,
            ),
            (
                "gyre_proxy_calls_replayed_total",
                "Calls re-sent by their harness after their answer was committed (a proxy restart \
                 or a dropped connection), answered again with the committed answer.",
                &self.replayed,
            ),
            (
                "gyre_proxy_stream_errors_total",
                "Streams ended with an error event.",
                &self.stream_errors,
            ),
            (
                "gyre_proxy_body_elements_total{how=\"parsed\"}",
                "Conversation elements (messages or input items) of request bodies, by whether \
                 they were parsed or taken over from the agent's previous body (same bytes).",
                &self.body_elements_parsed,
            ),
            (
                "gyre_proxy_body_elements_total{how=\"reused\"}",
                "",
                &self.body_elements_reused,
            ),
            (
                "gyre_proxy_connections_refused_total",
                "Client connections over --max-connections (answered overloaded and closed, or \
                 closed at once when too many of those were pending).",
                &self.connections_refused,
            ),
        ];
        for (name, help, value) in counters {
            let family = name.split('{').next().unwrap_or(name);
            if !help.is_empty() {
                out.push_str(&format!(
                    "# HELP {family} {help}\n# TYPE {family} counter\n"
                ));
            }
            out.push_str(&format!("{name} {}\n", value.load(Ordering::Relaxed)));
        }
        out.push_str(&format!(
            "# HELP gyre_proxy_connections_open Client connections being served.\n\
             # TYPE gyre_proxy_connections_open gauge\ngyre_proxy_connections_open {}\n",
            self.connections_open.load(Ordering::Relaxed)
        ));
        out.push_str(&format!(
            "# HELP gyre_proxy_websockets_open Responses WebSockets being served.\n\
             # TYPE gyre_proxy_websockets_open gauge\ngyre_proxy_websockets_open {}\n",
            self.websockets_open.load(Ordering::Relaxed)
        ));
        self.call_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .render(
                "gyre_proxy_call_seconds",
                "Request to recorded answer, seconds.",
                &mut out,
            );
        self.commit_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .render(
                "gyre_proxy_commit_seconds",
                "Committing one TITO record, seconds.",
                &mut out,
            );
        out.push_str(
            "# HELP gyre_proxy_stage_seconds Time a model call spent in each step before its \
             record is committed (wait for a preparing slot, parse, prepare = render + tokenize \
             + match, engine), seconds.\n# TYPE gyre_proxy_stage_seconds histogram\n",
        );
        let stages = self.stage_seconds.lock().unwrap_or_else(|p| p.into_inner());
        for ((_, label), histogram) in STAGES.iter().zip(stages.iter()) {
            histogram.render_series(
                "gyre_proxy_stage_seconds",
                &format!("stage=\"{label}\","),
                &mut out,
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_samples_are_kept_only_when_asked_for() {
        let metrics = Metrics::default();
        metrics.stage(Stage::Parse, 0.001);
        assert!(metrics.stage_samples().is_empty());
        metrics.keep_samples();
        metrics.stage(Stage::Parse, 0.002);
        metrics.stage(Stage::Engine, 0.5);
        metrics.commit_seconds(0.0003);
        let samples = metrics.stage_samples();
        let names: Vec<&str> = samples.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["wait", "parse", "prepare", "engine", "commit"]);
        assert_eq!(samples[1].1, [0.002]);
        assert_eq!(samples[3].1, [0.5]);
        assert_eq!(samples[4].1, [0.0003]);
        assert!(samples[0].1.is_empty());
    }

    #[test]
    fn stage_histograms_render_as_one_labelled_family() {
        let metrics = Metrics::default();
        metrics.stage(Stage::Parse, 0.0003);
        metrics.stage(Stage::Engine, 0.004);
        metrics.stage(Stage::Engine, 2.0);
        let text = metrics.render();
        assert_eq!(
            text.matches("# TYPE gyre_proxy_stage_seconds histogram")
                .count(),
            1
        );
        for line in [
            "gyre_proxy_stage_seconds_bucket{stage=\"parse\",le=\"0.0005\"} 1",
            "gyre_proxy_stage_seconds_count{stage=\"parse\"} 1",
            "gyre_proxy_stage_seconds_bucket{stage=\"engine\",le=\"0.005\"} 1",
            "gyre_proxy_stage_seconds_bucket{stage=\"engine\",le=\"5\"} 2",
            "gyre_proxy_stage_seconds_bucket{stage=\"engine\",le=\"+Inf\"} 2",
            "gyre_proxy_stage_seconds_sum{stage=\"engine\"} 2.004",
            "gyre_proxy_stage_seconds_count{stage=\"wait\"} 0",
            "gyre_proxy_commit_seconds_count 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
