//! Stop sequences (Anthropic `stop_sequences`, OpenAI Chat `stop`): the generated text is cut
//! where the earliest of them first appears, the sequence itself excluded, as the APIs define.
//!
//! [`StopStrings`] sits between the detokenizer and the output parser. It passes text on as it
//! streams, except a tail that could still be the start of a stop sequence, which it holds until
//! the next piece decides. The raw model text is matched (reasoning and tool-call markup
//! included), as SGLang and vLLM match `stop` strings. How the text is chunked never changes
//! where it is cut (a property test checks it).

/// The most stop sequences a request may give, and the longest one, in bytes: far above any
/// real use (OpenAI allows 4), and they bound the matcher's work per token. The record that
/// keeps them (`ModelCallRecord::stop_sequences`) is checked against the same bounds.
pub use gyre_event::{STOP_SEQUENCES_MAX, STOP_SEQUENCE_BYTES_MAX};

/// What one piece of text did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopPush {
    /// Text that is certainly before any stop sequence: pass it on.
    pub release: String,
    /// The stop sequence that just matched; nothing after it is ever released.
    pub matched: Option<String>,
}

/// The streaming stop-sequence matcher of one answer.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not released: a suffix that is a proper prefix of some stop.
    held: String,
    /// Bytes released so far; at a match, where the text was cut.
    released: usize,
    matched: Option<String>,
}

impl StopStrings {
    /// Empty sequences are ignored (they would stop before the first byte).
    pub fn new(stops: &[String]) -> Self {
        StopStrings {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            released: 0,
            matched: None,
        }
    }

    /// No stop sequences: every push releases its text unchanged (callers may skip it).
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Whether a sequence has matched (everything pushed since is dropped).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// After a match: the byte offset, in all the text pushed, where the sequence starts (the
    /// length of what was released).
    pub fn cut(&self) -> Option<usize> {
        self.matched.as_ref().map(|_| self.released)
    }

    /// The next piece of generated text.
    pub fn push(&mut self, text: &str) -> StopPush {
        if self.matched.is_some() {
            return StopPush::default();
        }
        if self.stops.is_empty() {
            self.released += text.len();
            return StopPush {
                release: text.to_string(),
                matched: None,
            };
        }
        self.held.push_str(text);
        // The sequence completed first wins (as an engine stops at the first token whose text
        // completes one); of two completed by the same byte, the longer. Anything that ends in
        // an earlier piece matched there, so this is the same however the text is chunked.
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()).map(|at| (at, stop)))
            .min_by(|(a, x), (b, y)| (a + x.len()).cmp(&(b + y.len())).then(a.cmp(b)));
        if let Some((at, stop)) = earliest {
            let stop = stop.clone();
            let release = self.held[..at].to_string();
            self.released += release.len();
            self.held.clear();
            self.matched = Some(stop.clone());
            return StopPush {
                release,
                matched: Some(stop),
            };
        }
        // Hold the longest suffix that could still grow into a stop sequence.
        let keep_from = (0..=self.held.len())
            .filter(|&at| self.held.is_char_boundary(at))
            .find(|&at| {
                let tail = &self.held[at..];
                tail.is_empty() || self.stops.iter().any(|stop| stop.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let release = self.held[..keep_from].to_string();
        self.released += release.len();
        self.held.drain(..keep_from);
        StopPush {
            release,
            matched: None,
        }
    }

    /// The output ended without a match: the held tail is ordinary text.
    pub fn finish(&mut self) -> String {
        let tail = std::mem::take(&mut self.held);
        self.released += tail.len();
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stops(list: &[&str]) -> StopStrings {
        StopStrings::new(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// The whole text through the matcher in the given pieces: (released text, matched).
    fn run(matcher: &mut StopStrings, pieces: &[&str]) -> (String, Option<String>) {
        let mut out = String::new();
        for piece in pieces {
            let push = matcher.push(piece);
            out.push_str(&push.release);
            if push.matched.is_some() {
                return (out, push.matched);
            }
        }
        out.push_str(&matcher.finish());
        (out, None)
    }

    #[test]
    fn cuts_before_the_sequence_across_pieces() {
        let mut matcher = stops(&["END"]);
        assert_eq!(
            matcher.push("hello E"),
            StopPush {
                release: "hello ".into(),
                matched: None
            }
        );
        assert_eq!(
            matcher.push("N"),
            StopPush {
                release: String::new(),
                matched: None
            }
        );
        assert_eq!(
            matcher.push("D and more"),
            StopPush {
                release: String::new(),
                matched: Some("END".into())
            }
        );
        assert_eq!(matcher.push("after"), StopPush::default());
        assert_eq!(matcher.matched(), Some("END"));
    }

    #[test]
    fn a_false_start_is_released() {
        let mut matcher = stops(&["END"]);
        assert_eq!(
            run(&mut matcher, &["E", "N", "x", " ok"]),
            ("ENx ok".into(), None)
        );
        let mut matcher = stops(&["END"]);
        assert_eq!(run(&mut matcher, &["text EN"]), ("text EN".into(), None));
    }

    #[test]
    fn the_first_completed_wins_then_the_longer() {
        let mut matcher = stops(&["world", "o w", "o"]);
        assert_eq!(
            run(&mut matcher, &["hello world"]),
            ("hell".into(), Some("o".into()))
        );
        // "bc" is complete before "abcd" is, though "abcd" starts first.
        let mut matcher = stops(&["abcd", "bc"]);
        assert_eq!(
            run(&mut matcher, &["xabcd"]),
            ("xa".into(), Some("bc".into()))
        );
        let mut matcher = stops(&["c", "abc"]);
        assert_eq!(
            run(&mut matcher, &["xabc"]),
            ("x".into(), Some("abc".into()))
        );
    }

    #[test]
    fn no_sequences_pass_everything_and_empty_ones_are_ignored() {
        let mut matcher = stops(&[]);
        assert_eq!(run(&mut matcher, &["a", "b"]), ("ab".into(), None));
        let mut matcher = stops(&["", "zz"]);
        assert_eq!(run(&mut matcher, &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let mut matcher = stops(&["é!"]);
        assert_eq!(
            run(&mut matcher, &["café", "!", "x"]),
            ("caf".into(), Some("é!".into()))
        );
        let mut matcher = stops(&["é!"]);
        assert_eq!(run(&mut matcher, &["caféé", "?"]), ("caféé?".into(), None));
    }

    proptest! {
        /// However the text is split, the output is the text before the sequence completed
        /// first (the longer of two completed together; the whole text if none).
        #[test]
        fn chunking_never_changes_the_cut(
            text in "[abc é]{0,40}",
            sequences in proptest::collection::vec("[abc é]{1,4}", 0..4),
            cuts in proptest::collection::vec(0usize..48, 0..8),
        ) {
            let expected = sequences
                .iter()
                .filter_map(|s| text.find(s.as_str()).map(|at| (at, s.clone())))
                .min_by(|(a, x), (b, y)| (a + x.len()).cmp(&(b + y.len())).then(a.cmp(b)));
            let (expected_text, expected_stop) = match expected {
                Some((at, stop)) => (text[..at].to_string(), Some(stop)),
                None => (text.clone(), None),
            };
            let mut bounds: Vec<usize> = cuts
                .into_iter()
                .map(|cut| cut.min(text.len()))
                .filter(|&cut| text.is_char_boundary(cut))
                .collect();
            bounds.push(0);
            bounds.push(text.len());
            bounds.sort_unstable();
            bounds.dedup();
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let mut matcher = StopStrings::new(&sequences);
            let (out, stop) = run(&mut matcher, &pieces);
            prop_assert_eq!(matcher.cut(), stop.as_ref().map(|_| out.len()));
            prop_assert_eq!(out, expected_text);
            prop_assert_eq!(stop, expected_stop);
        }
    }
}
