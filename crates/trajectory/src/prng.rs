//! A tiny deterministic PRNG (SplitMix64) for the admission draw.
//!
//! The draw must replay identically from the log, so it is seeded only from logged values: the
//! run seed (`RunConfig::run_seed`) and the execution id. SplitMix64 (Steele, Lea, Flood 2014;
//! the seeding generator of xoshiro) is a 64-bit counter passed through a strong mixer: one
//! add, three xor-shifts and two multiplies per output. It is not cryptographic and needs none
//! of the `rand` crate, which pure crates may not depend on (STYLE rule 16).

/// SplitMix64 state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The admission stream of one execution: the run seed and the execution key are mixed so
    /// that neighbouring executions get unrelated streams.
    pub fn for_execution(run_seed: u64, execution_key: u64) -> Self {
        Self::new(mix(run_seed ^ mix(execution_key.wrapping_add(GOLDEN_GAMMA))))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// A uniform integer in `[0, bound)` without modulo bias (Lemire's widening multiply with
    /// rejection). `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "below() needs a positive bound");
        loop {
            let product = (self.next_u64() as u128) * (bound as u128);
            let low = product as u64;
            let threshold = bound.wrapping_neg() % bound;
            if low >= threshold {
                return (product >> 64) as u64;
            }
        }
    }
}

/// FNV-1a 64-bit hash of a string: how the CLI turns an execution name into the stable key
/// that seeds its draw (the name, not its position in the file, decides the stream).
pub fn fnv1a64(text: &str) -> u64 {
    let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
    for byte in text.bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_vector() {
        // Reference values of SplitMix64 seeded with 1234567 (from the public-domain C code).
        let mut rng = SplitMix64::new(1234567);
        assert_eq!(rng.next_u64(), 6457827717110365317);
        assert_eq!(rng.next_u64(), 3203168211198807973);
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = SplitMix64::for_execution(7, 9);
        for bound in 1..200u64 {
            assert!(rng.below(bound) < bound);
        }
    }
}
