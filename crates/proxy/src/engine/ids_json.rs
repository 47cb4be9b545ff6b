//! [`IdsJson`]: a token-id sequence's JSON array text, kept beside the ids so that a context
//! which extends the previous call's is serialised only for its new ids.
//!
//! SGLang's `/generate` and vLLM's generate endpoint take the whole prompt as a JSON array of
//! ids on every call. An agent's context grows to 128K tokens while each call adds a few
//! hundred or thousand, so writing the whole array every call made the engine body the
//! largest O(context) cost of a call after parsing (measured: 14% of the proxy's CPU at 1 to
//! 128K tokens, `gyre bench proxy --concurrency 1 --step 1024`). The session keeps one of
//! these per agent context: a call truncates the previous text to the tokens it reuses (one
//! `truncate`, re-writing at most [`MARK_EVERY`] − 1 ids) and appends the new ones.

use std::fmt;

/// The text offset of every `MARK_EVERY`-th id is kept (4 bytes per 64 ids): truncating to any
/// length re-writes fewer than this many ids.
pub const MARK_EVERY: usize = 64;

/// The JSON text of an id array, without the brackets: `1,2,3`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct IdsJson {
    text: Vec<u8>,
    /// `marks[i]`: where id `i * MARK_EVERY` starts in `text` (at its separating comma).
    marks: Vec<u32>,
    count: usize,
}

impl fmt::Debug for IdsJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdsJson({} ids, {} bytes)", self.count, self.text.len())
    }
}

impl IdsJson {
    /// The text of `ids`.
    pub fn of(ids: &[u32]) -> IdsJson {
        let mut json = IdsJson::default();
        json.extend(ids);
        json
    }

    /// How many ids the text holds.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends `ids`.
    pub fn extend(&mut self, ids: &[u32]) {
        self.text.reserve(ids.len() * 7);
        let mut digits = itoa::Buffer::new();
        for id in ids {
            if self.count.is_multiple_of(MARK_EVERY) {
                self.marks
                    .push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
            }
            if self.count > 0 {
                self.text.push(b',');
            }
            self.text.extend_from_slice(digits.format(*id).as_bytes());
            self.count += 1;
        }
    }

    /// Room for `more` ids without growing. When the text must grow it is copied into a new
    /// allocation with a quarter of headroom (see the session's context buffers).
    pub fn reserve(&mut self, more: usize) {
        self.text = with_room(std::mem::take(&mut self.text), more * 7);
        self.marks.reserve(more / MARK_EVERY + 1);
    }

    /// Keeps the first `keep` ids. `ids` must be the sequence this text was written from (at
    /// least its first `keep` ids); the ids after the last mark below `keep` are re-written
    /// from it.
    pub fn truncate(&mut self, ids: &[u32], keep: usize) {
        if keep >= self.count {
            return;
        }
        let mark = keep / MARK_EVERY;
        let start = mark * MARK_EVERY;
        self.text.truncate(self.marks[mark] as usize);
        self.marks.truncate(mark);
        self.count = start;
        self.extend(&ids[start..keep]);
    }

    /// The text without the brackets (`1,2,3`).
    pub fn text(&self) -> &[u8] {
        &self.text
    }

    /// Bytes of the array with its brackets.
    pub fn array_len(&self) -> usize {
        self.text.len() + 2
    }

    /// Writes the array, brackets included.
    pub fn write_array(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        out.extend_from_slice(&self.text);
        out.push(b']');
    }
}

/// `buffer` with room for `room` more items. When it must grow it is copied into a new
/// allocation with a quarter of headroom (an agent's context grows a little every call, so most
/// calls then fit); `Vec::reserve`'s in-place reallocation of multi-megabyte buffers cost more
/// (measured at 384 executions: page faults and TLB shootdowns).
pub(crate) fn with_room<T: Copy>(buffer: Vec<T>, room: usize) -> Vec<T> {
    if buffer.capacity() - buffer.len() >= room {
        return buffer;
    }
    // At least double, and never below 1 MiB: a context grows call by call, and every growth
    // copies the whole buffer into fresh pages (a page fault each) on the call's path.
    let floor = (1 << 20) / std::mem::size_of::<T>().max(1);
    let capacity = (buffer.len() + room).max(buffer.len() * 2).max(floor);
    let mut grown = Vec::with_capacity(capacity);
    grown.extend_from_slice(&buffer);
    grown
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn array(json: &IdsJson) -> String {
        let mut out = Vec::new();
        json.write_array(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn empty_and_single() {
        assert_eq!(array(&IdsJson::of(&[])), "[]");
        assert_eq!(array(&IdsJson::of(&[0])), "[0]");
        assert_eq!(
            array(&IdsJson::of(&[7, u32::MAX, 42])),
            format!("[7,{},42]", u32::MAX)
        );
    }

    proptest! {
        /// Any sequence of truncations and extensions leaves exactly the text serde_json
        /// writes for the same ids.
        #[test]
        fn edits_match_a_fresh_serialisation(
            first in proptest::collection::vec(any::<u32>(), 0..400),
            edits in proptest::collection::vec(
                (0usize..500, proptest::collection::vec(0u32..200_000, 0..200)), 1..8),
        ) {
            let mut ids = first.clone();
            let mut json = IdsJson::of(&ids);
            for (keep, more) in edits {
                let keep = keep.min(ids.len());
                json.truncate(&ids, keep);
                ids.truncate(keep);
                json.extend(&more);
                ids.extend_from_slice(&more);
                prop_assert_eq!(json.len(), ids.len());
                prop_assert_eq!(array(&json), serde_json::to_string(&ids).unwrap());
            }
        }
    }
}
