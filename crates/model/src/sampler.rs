//! Drawing one token from logits under temperature / top-p, with its behaviour log-prob.
//!
//! The reported log-prob is the log of the probability the token actually had in the
//! distribution it was drawn from: softmax(logits / T), truncated to the smallest top-p nucleus
//! and renormalised. With T = 1 and top-p = 1 it is the model's log π_θ, the quantity the
//! trainer recomputes. Arithmetic is f64 over the f32 logits; the draw uses the request's own
//! SplitMix64 stream, so the same logits and seed always give the same token.

use gyre_engine::SamplingParams;
use gyre_trajectory::SplitMix64;

use crate::init::uniform;

/// Draws one token; returns `(token, behaviour log-prob)`.
pub fn sample_token(logits: &[f32], params: &SamplingParams, rng: &mut SplitMix64) -> (u32, f32) {
    assert!(!logits.is_empty(), "logits over an empty vocabulary");
    if params.greedy {
        let (token, _) =
            logits
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (index, &value)| {
                    if value > best.1 {
                        (index, value)
                    } else {
                        best
                    }
                });
        let log_sum = log_sum_exp(logits.iter().map(|&value| value as f64));
        return (token as u32, (logits[token] as f64 - log_sum) as f32);
    }
    let scaled: Vec<f64> = logits
        .iter()
        .map(|&value| value as f64 / params.temperature)
        .collect();
    let log_sum = log_sum_exp(scaled.iter().copied());
    let probabilities: Vec<f64> = scaled.iter().map(|value| (value - log_sum).exp()).collect();
    let draw = uniform(rng);
    if params.top_p >= 1.0 {
        let token = pick(
            draw,
            1.0,
            (0..probabilities.len()).map(|index| (index, probabilities[index])),
        );
        return (token as u32, (scaled[token] - log_sum) as f32);
    }
    // The nucleus: most probable first (ties by id), until the mass reaches top_p.
    let mut order: Vec<usize> = (0..probabilities.len()).collect();
    order.sort_by(|a, b| {
        probabilities[*b]
            .total_cmp(&probabilities[*a])
            .then(a.cmp(b))
    });
    let mut mass = 0.0;
    let mut kept = 0;
    for &index in &order {
        mass += probabilities[index];
        kept += 1;
        if mass >= params.top_p {
            break;
        }
    }
    let nucleus = &order[..kept];
    let token = pick(
        draw,
        mass,
        nucleus.iter().map(|&index| (index, probabilities[index])),
    );
    (token as u32, ((scaled[token] - log_sum) - mass.ln()) as f32)
}

/// The token whose cumulative-probability interval holds `draw · mass`.
fn pick(draw: f64, mass: f64, candidates: impl Iterator<Item = (usize, f64)>) -> usize {
    let threshold = draw * mass;
    let mut cumulative = 0.0;
    let mut last = 0;
    for (index, probability) in candidates {
        if probability <= 0.0 {
            continue;
        }
        cumulative += probability;
        last = index;
        if threshold < cumulative {
            return index;
        }
    }
    // Rounding can leave the threshold a hair above the total: take the last candidate.
    last
}

fn log_sum_exp(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let maximum = values.clone().fold(f64::NEG_INFINITY, f64::max);
    maximum
        + values
            .map(|value| (value - maximum).exp())
            .sum::<f64>()
            .ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f64, top_p: f64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            new_tokens_max: 1,
            stop_tokens: vec![],
            seed: 1,
            greedy: false,
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus_and_renormalises() {
        // Probabilities ≈ [0.665, 0.245, 0.090]: top-p 0.7 keeps the first two.
        let logits = [2.0f32, 1.0, 0.0];
        let mut rng = SplitMix64::new(5);
        for _ in 0..200 {
            let (token, logprob) = sample_token(&logits, &params(1.0, 0.7), &mut rng);
            assert!(token < 2, "token {token} is outside the nucleus");
            let probabilities = [0.665_240_9f64, 0.244_728_5];
            let expected =
                (probabilities[token as usize] / (probabilities[0] + probabilities[1])).ln();
            assert!((logprob as f64 - expected).abs() < 1e-5);
        }
    }

    #[test]
    fn greedy_takes_the_argmax_with_its_model_logprob() {
        let logits = [0.0f32, 3.0, 1.0];
        let (token, logprob) = sample_token(
            &logits,
            &SamplingParams::greedy(1, vec![]),
            &mut SplitMix64::new(0),
        );
        assert_eq!(token, 1);
        let expected = 3.0 - (1.0f64 + 3f64.exp() + 1f64.exp()).ln();
        assert!((logprob as f64 - expected).abs() < 1e-6);
    }
}
