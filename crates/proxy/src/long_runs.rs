//! Bounds the memory one over-long word costs the tokenizer.
//!
//! A byte-level BPE keeps a node per byte of the word it merges (and `tokenizers` an alignment
//! pair per byte of the text around it): measured, one 30 MB word of `é` took about 5 GB to
//! encode. A body limit does not stop that (32 MiB by default), and the text is the harness's
//! (a tool printed it), so a request cannot simply be refused for it without ending the
//! agent's execution.
//!
//! Every split pattern the proxy's tokenizers use keeps a pre-token within one class of
//! characters (letters, numbers, white space, everything else), give or take one leading
//! character. So a text whose runs of one class are all at most [`RUN_BYTES_MAX`] long has no
//! word longer than that, and is encoded whole, exactly as `tokenizers` would. A longer run is
//! cut every [`RUN_BYTES_MAX`] bytes (at a character boundary) and the pieces are encoded one
//! after another: the tokens of that run are then a valid encoding of its text, though not
//! necessarily the merges `tokenizers` would pick for the whole word, and everything outside
//! the run encodes as before (a cut inside a run of letters, numbers or symbols leaves the
//! pre-tokens before and after it as they were). The prompt is what the proxy sends and
//! records, so the policy is trained on exactly the tokens it was shown.

/// The longest run of one class of characters encoded in one piece.
pub const RUN_BYTES_MAX: usize = 64 << 10;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

fn class(character: char) -> Class {
    if character.is_ascii() {
        return match character {
            'a'..='z' | 'A'..='Z' => Class::Letter,
            '0'..='9' => Class::Number,
            ' ' | '\t' | '\n' | '\r' | '\u{b}' | '\u{c}' => Class::Space,
            _ => Class::Other,
        };
    }
    if character.is_alphabetic() {
        Class::Letter
    } else if character.is_numeric() {
        Class::Number
    } else if character.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// Byte positions at which to cut `text` so that no run of one class of characters is longer
/// than `run_bytes_max` between two cuts; empty for any ordinary text. Every position is a
/// character boundary strictly inside `text`, in increasing order.
pub fn cuts(text: &str, run_bytes_max: usize) -> Vec<usize> {
    let mut cuts = Vec::new();
    if text.len() <= run_bytes_max {
        return cuts;
    }
    let run_bytes_max = run_bytes_max.max(4);
    let mut run_class = None;
    // Where the current run, or its part since the last cut, starts.
    let mut since = 0;
    for (at, character) in text.char_indices() {
        let here = class(character);
        if run_class != Some(here) {
            run_class = Some(here);
            since = at;
        } else if at + character.len_utf8() - since > run_bytes_max {
            cuts.push(at);
            since = at;
        }
    }
    cuts
}

/// Token ids and each token's byte range in the text.
pub type Encoded = (Vec<u32>, Vec<(usize, usize)>);

/// Encodes `text` with `encode`, whole when it has no over-long run, otherwise piece by piece
/// between [`cuts`], with each piece's offsets moved to where it lies in `text`.
pub fn encode_in_pieces<E>(
    text: &str,
    run_bytes_max: usize,
    mut encode: impl FnMut(&str) -> Result<Encoded, E>,
) -> Result<Encoded, E> {
    let cuts = cuts(text, run_bytes_max);
    if cuts.is_empty() {
        return encode(text);
    }
    let mut ids = Vec::new();
    let mut offsets = Vec::new();
    let mut from = 0;
    for to in cuts.into_iter().chain(std::iter::once(text.len())) {
        let (piece_ids, piece_offsets) = encode(&text[from..to])?;
        ids.extend_from_slice(&piece_ids);
        offsets.extend(
            piece_offsets
                .iter()
                .map(|(start, end)| (start + from, end + from)),
        );
        from = to;
    }
    Ok((ids, offsets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_text_is_never_cut() {
        let json = r#"{"a":[1,2,3],"b":"xyz"}"#.repeat(10_000);
        assert!(cuts(&json, 64).is_empty());
        let prose = "the quick brown fox, jumps over the lazy dog. ".repeat(10_000);
        assert!(cuts(&prose, 64).is_empty());
        assert!(cuts("short", 8).is_empty());
    }

    #[test]
    fn a_long_run_is_cut_at_character_boundaries_within_the_limit() {
        let text = format!("ab {} cd", "é".repeat(1000));
        let cuts = cuts(&text, 101);
        assert!(!cuts.is_empty());
        let mut from = 0;
        for &at in cuts.iter().chain(std::iter::once(&text.len())) {
            assert!(text.is_char_boundary(at));
            assert!(at > from);
            // A piece holds at most the limit of the run, plus what came before the run.
            assert!(text[from..at].chars().filter(|c| *c == 'é').count() * 2 <= 101);
            from = at;
        }
        // Runs of other classes are cut too, each on its own.
        let mixed = format!("{}{}{}", "a".repeat(250), "1".repeat(250), " ".repeat(250));
        let cuts = super::cuts(&mixed, 100);
        assert_eq!(cuts, vec![100, 200, 350, 450, 600, 700]);
    }

    #[test]
    fn pieces_keep_their_place_in_the_text() {
        let text = "x".repeat(10);
        let encoded = encode_in_pieces(&text, 4, |piece| {
            Ok::<_, ()>((vec![piece.len() as u32], vec![(0, piece.len())]))
        })
        .unwrap();
        assert_eq!(encoded.0, vec![4, 4, 2]);
        assert_eq!(encoded.1, vec![(0, 4), (4, 8), (8, 10)]);
    }
}
