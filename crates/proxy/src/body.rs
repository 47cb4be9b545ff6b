//! Request bodies parsed incrementally against the same agent's previous body.
//!
//! Harnesses re-send the whole conversation on every call, so at 128K tokens each body is
//! ~0.5 MB of JSON of which only the last few messages are new. Parsing it whole costs about
//! as much as rendering it. [`parse_body`] compares the new bytes with the previous body's
//! (one `memcmp`) and takes over the previous document's conversation elements that lie wholly
//! inside the common byte prefix, and the members after the conversation whose value bytes
//! are unchanged (Claude Code sends `system` and ~30–60 KB of `tools` there); only the rest
//! is parsed.
//!
//! **Exactness.** JSON is parsed left to right, so an element whose bytes are identical in both
//! bodies, at the same offset, with identical bytes before it, has the identical value and
//! path (a number or literal needs the byte after it identical too: `1` could be `12`). The members before the conversation are taken over the same
//! way. Everything else is parsed with `serde_json`, value by value, and the members are
//! inserted in order with [`Map::insert`], which is what a whole-document parse does (a
//! duplicated key keeps its first position and its last value). Anything the element-wise
//! reader does not accept falls back to the whole-document parse, so errors read exactly as
//! they always did. A property test checks the result against `serde_json::from_slice` for
//! edited, truncated and corrupted bodies.
//!
//! `serde_json` bounds nesting at 128 levels per parse; a value parsed here on its own is
//! refused (and so parsed whole, which gives the error) when it nests deeper than it could
//! inside the whole document.

use std::ops::Range;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::messages::Api;
use crate::reader::{body_object, Read};

/// The member that holds the conversation in each API's body.
pub fn conversation_key(api: Api) -> &'static str {
    match api {
        Api::Anthropic | Api::OpenAiChat => "messages",
        Api::OpenAiResponses => "input",
    }
}

/// A parsed body, kept so that the next body of the same agent can reuse it.
#[derive(Debug)]
pub struct ParsedBody {
    key: &'static str,
    bytes: Bytes,
    value: Value,
    /// `None` when the body cannot seed the next parse (no conversation array, duplicated
    /// keys, or it was parsed whole).
    layout: Option<Layout>,
    reused: usize,
}

#[derive(Debug)]
struct Layout {
    /// Members before the conversation, in body order (all distinct).
    prefix_keys: Vec<String>,
    /// Offset of the conversation array's `[`.
    conversation_at: usize,
    /// End offset (exclusive) of each conversation element.
    element_ends: Vec<usize>,
    /// Members after the conversation whose value is an object, array or string (values that
    /// end at their own closing byte): name and the value's byte range.
    trailing: Vec<(String, Range<usize>)>,
}

impl ParsedBody {
    /// The body as one JSON value (an object).
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The conversation array's elements as the body holds them, separated by commas (and
    /// whatever whitespace the client put between them); `None` when the body was parsed
    /// whole (then read the value).
    pub fn conversation_items(&self) -> Option<&[u8]> {
        let layout = self.layout.as_ref()?;
        let start = layout.conversation_at + 1;
        let end = layout.element_ends.last().copied().unwrap_or(start);
        let items = self.bytes.get(start..end)?;
        Some(items.trim_ascii_start())
    }

    /// Conversation elements taken over from the previous body instead of being parsed.
    pub fn reused_elements(&self) -> usize {
        self.reused
    }

    /// Bytes the body has.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Conversation elements the body has (0 when it has no conversation array).
    pub fn elements(&self) -> usize {
        match &self.layout {
            Some(layout) => layout.element_ends.len(),
            None => self
                .value
                .get(self.key)
                .and_then(Value::as_array)
                .map_or(0, Vec::len),
        }
    }
}

/// Parses `bytes` as a top-level JSON object for `api`, reusing `previous` (the same agent's
/// last body) where the bytes are the same. The result equals a whole-document parse, and a
/// body that does not parse gets exactly the whole-document parse's error.
pub fn parse_body(api: Api, bytes: Bytes, previous: Option<ParsedBody>) -> Read<ParsedBody> {
    let key = conversation_key(api);
    let bytes = replace_lone_surrogates(bytes);
    if let Some(parsed) = parse_elementwise(&bytes, key, previous) {
        let (value, layout, reused) = parsed;
        return Ok(ParsedBody {
            key,
            bytes,
            value,
            layout,
            reused,
        });
    }
    let value = body_object(api, &bytes)?;
    Ok(ParsedBody {
        key,
        bytes,
        value,
        layout: None,
        reused: 0,
    })
}

/// `\uXXXX` escapes of UTF-16 surrogates that are not part of a pair, rewritten in place to
/// `\ufffd` (the replacement character, also six bytes), so the body parses.
///
/// JavaScript strings are UTF-16, and a harness that cuts one by code units (a long tool
/// output truncated to N characters) can cut an emoji in half; `JSON.stringify` then writes
/// the lone half as an escape (`"\ud83d"`), which Python's `json` and the model APIs accept
/// and `serde_json` refuses. Replacing it is what decoding the string as UTF-8 would do. The
/// same body always becomes the same bytes, so the next turn's history (which repeats the
/// escape) still extends this one. Bodies without such an escape are returned as they are
/// (one `memchr` scan for `\u`, rare in harness traffic: JavaScript's `JSON.stringify` writes
/// it only for control characters).
pub fn replace_lone_surrogates(bytes: Bytes) -> Bytes {
    match lone_surrogates_replaced(&bytes) {
        Some(fixed) => {
            tracing::debug!("a request body held lone UTF-16 surrogate escapes; replaced");
            Bytes::from(fixed)
        }
        None => bytes,
    }
}

/// [`replace_lone_surrogates`] on a slice: the rewritten copy, or `None` when nothing needs it.
pub(crate) fn lone_surrogates_replaced(bytes: &[u8]) -> Option<Vec<u8>> {
    fn surrogate_at(bytes: &[u8], at: usize) -> Option<u16> {
        let hex = bytes.get(at + 2..at + 6)?;
        let text = std::str::from_utf8(hex).ok()?;
        let unit = u16::from_str_radix(text, 16).ok()?;
        (0xD800..=0xDFFF).contains(&unit).then_some(unit)
    }
    let mut fixed: Option<Vec<u8>> = None;
    let mut skip_to = 0;
    for at in memchr::memmem::find_iter(bytes, b"\\u") {
        if at < skip_to {
            continue;
        }
        // An escape starts here only after an even run of backslashes (`\\u` is a
        // backslash and a `u`).
        let run = bytes[..at]
            .iter()
            .rev()
            .take_while(|b| **b == b'\\')
            .count();
        if run % 2 == 1 {
            continue;
        }
        let Some(unit) = surrogate_at(bytes, at) else {
            continue;
        };
        let paired = (0xD800..0xDC00).contains(&unit)
            && bytes.get(at + 6..at + 8) == Some(b"\\u")
            && surrogate_at(bytes, at + 6).is_some_and(|low| low >= 0xDC00);
        if paired {
            skip_to = at + 12;
            continue;
        }
        fixed.get_or_insert_with(|| bytes.to_vec())[at..at + 6].copy_from_slice(b"\\ufffd");
    }
    fixed
}

/// What a previous body offers: its prefix members and its first `elements` conversation
/// elements, valid because those bytes are identical in the new body.
struct Reuse {
    prefix: Vec<(String, Value)>,
    conversation_at: usize,
    elements: Vec<Value>,
    element_ends: Vec<usize>,
    /// The previous body's trailing members, each reused where the new body has the same
    /// name with the same value bytes (Claude Code sends its ~30–60 KB `tools` and its
    /// `system` after `messages`, unchanged from call to call).
    trailing: Vec<(String, Value)>,
    trailing_ranges: Vec<Range<usize>>,
    bytes: Bytes,
}

impl Reuse {
    /// The previous value of member `name` when the bytes at `at` start with its bytes.
    fn trailing_at(&mut self, name: &str, bytes: &[u8], at: usize) -> Option<(Value, usize)> {
        let index = self.trailing.iter().position(|(known, _)| known == name)?;
        let range = self.trailing_ranges[index].clone();
        let len = range.len();
        if bytes.get(at..at + len)? != &self.bytes[range] {
            return None;
        }
        self.trailing_ranges.swap_remove(index);
        Some((self.trailing.swap_remove(index).1, len))
    }
}

/// A previous body with more top-level members than this is not reused: real bodies have a
/// dozen or two, and the matching below is linear in them per member (a body of millions of
/// empty members must not cost a quadratic search).
const REUSED_MEMBERS_MAX: usize = 256;

fn reuse_from(bytes: &[u8], key: &str, previous: ParsedBody) -> Option<Reuse> {
    let layout = previous.layout?;
    if layout.prefix_keys.len() + layout.trailing.len() > REUSED_MEMBERS_MAX {
        return None;
    }
    let same = common_prefix(&previous.bytes, bytes);
    // The `[` and the byte after each reused element must be inside the common prefix.
    if layout.conversation_at >= same {
        return None;
    }
    let Value::Object(mut map) = previous.value else {
        return None;
    };
    let mut elements = layout.element_ends.partition_point(|end| *end < same);
    // An object, array or string ends at its own closing byte; a number or literal needs the
    // next byte too (`1` could have been `12`).
    let self_delimited = matches!(
        map.get(key)
            .and_then(Value::as_array)
            .and_then(|all| all.get(elements)),
        Some(Value::Object(_) | Value::Array(_) | Value::String(_))
    );
    if layout.element_ends.get(elements) == Some(&same) && self_delimited {
        elements += 1;
    }
    let mut prefix = Vec::with_capacity(layout.prefix_keys.len());
    for name in layout.prefix_keys {
        let value = map.remove(&name)?;
        prefix.push((name, value));
    }
    let Some(Value::Array(mut all)) = map.remove(key) else {
        return None;
    };
    if all.len() != layout.element_ends.len() {
        return None;
    }
    all.truncate(elements);
    let mut element_ends = layout.element_ends;
    element_ends.truncate(elements);
    let mut trailing = Vec::with_capacity(layout.trailing.len());
    let mut trailing_ranges = Vec::with_capacity(layout.trailing.len());
    for (name, range) in layout.trailing {
        let value = map.remove(&name)?;
        trailing.push((name, value));
        trailing_ranges.push(range);
    }
    Some(Reuse {
        prefix,
        conversation_at: layout.conversation_at,
        elements: all,
        element_ends,
        trailing,
        trailing_ranges,
        bytes: previous.bytes,
    })
}

fn common_prefix(left: &[u8], right: &[u8]) -> usize {
    // Compare in blocks (memcmp speed), then finish byte by byte inside the first differing one.
    const BLOCK: usize = 4096;
    let len = left.len().min(right.len());
    let mut at = 0;
    while at + BLOCK <= len && left[at..at + BLOCK] == right[at..at + BLOCK] {
        at += BLOCK;
    }
    while at < len && left[at] == right[at] {
        at += 1;
    }
    at
}

type Elementwise = (Value, Option<Layout>, usize);

/// The element-wise reader. `None` means "not accepted here": the caller parses the whole
/// document, which either produces the same value or the canonical error.
fn parse_elementwise(bytes: &[u8], key: &str, previous: Option<ParsedBody>) -> Option<Elementwise> {
    let mut reuse = previous.and_then(|previous| reuse_from(bytes, key, previous));
    let mut reader = Cursor { bytes, at: 0 };
    let mut map = Map::new();
    let mut prefix_keys = Vec::new();
    let mut duplicated = false;
    let mut conversation: Option<(usize, Vec<usize>)> = None;
    let mut trailing = Vec::new();
    let mut reused = 0;
    let mut resume = None;
    if let Some(reuse) = &mut reuse {
        for (name, value) in reuse.prefix.drain(..) {
            prefix_keys.push(name.clone());
            map.insert(name, value);
        }
        reader.at = reuse.conversation_at;
        reused = reuse.elements.len();
        resume = Some((
            std::mem::take(&mut reuse.elements),
            std::mem::take(&mut reuse.element_ends),
        ));
    } else {
        reader.skip_space();
        if !reader.eat(b'{') {
            return None;
        }
        reader.skip_space();
        if reader.eat(b'}') {
            return reader.finish().then_some((Value::Object(map), None, 0));
        }
    }
    loop {
        let name = if resume.is_some() {
            key.to_string()
        } else {
            let Value::String(name) = reader.value(1)? else {
                return None;
            };
            reader.skip_space();
            if !reader.eat(b':') {
                return None;
            }
            reader.skip_space();
            name
        };
        let value = if name == key && conversation.is_none() && reader.peek() == Some(b'[') {
            let at = reader.at;
            let (elements, ends) = match resume.take() {
                Some((elements, ends)) => reader.array_after(elements, ends)?,
                None => reader.array_after(Vec::new(), Vec::new())?,
            };
            conversation = Some((at, ends));
            Value::Array(elements)
        } else if conversation.is_some() {
            let start = reader.at;
            let known = reuse
                .as_mut()
                .and_then(|reuse| reuse.trailing_at(&name, bytes, start));
            let value = match known {
                Some((value, len)) => {
                    reader.at += len;
                    value
                }
                None => reader.value(1)?,
            };
            if matches!(value, Value::Object(_) | Value::Array(_) | Value::String(_)) {
                trailing.push((name.clone(), start..reader.at));
            }
            value
        } else {
            reader.value(1)?
        };
        if conversation.is_none() {
            prefix_keys.push(name.clone());
        }
        duplicated |= map.insert(name, value).is_some();
        reader.skip_space();
        if reader.eat(b',') {
            reader.skip_space();
            continue;
        }
        if reader.eat(b'}') {
            break;
        }
        return None;
    }
    if !reader.finish() {
        return None;
    }
    let layout = match conversation {
        Some((conversation_at, element_ends)) if !duplicated => Some(Layout {
            prefix_keys,
            conversation_at,
            element_ends,
            trailing,
        }),
        _ => None,
    };
    Some((Value::Object(map), layout, reused))
}

/// Containers `serde_json` lets one document nest (its recursion limit of 128 is reached on
/// entering the 128th).
const DEPTH_MAX: usize = 127;

/// Containers nested in `value`, itself included (0 for a scalar).
fn nesting(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        Value::Object(members) => 1 + members.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            self.at += 1;
        }
    }

    /// Only whitespace is left.
    fn finish(&mut self) -> bool {
        self.skip_space();
        self.at == self.bytes.len()
    }

    /// One JSON value at the cursor (no leading whitespace expected), `enclosing` containers
    /// deep in the document.
    fn value(&mut self, enclosing: usize) -> Option<Value> {
        let mut stream =
            serde_json::Deserializer::from_slice(&self.bytes[self.at..]).into_iter::<Value>();
        let value = stream.next()?.ok()?;
        if enclosing + nesting(&value) > DEPTH_MAX {
            return None;
        }
        self.at += stream.byte_offset();
        Some(value)
    }

    /// The rest of an array: at its `[` with `elements` empty, or just after the last of
    /// `elements` (taken over, each ending at the matching entry of `ends`).
    fn array_after(
        &mut self,
        mut elements: Vec<Value>,
        mut ends: Vec<usize>,
    ) -> Option<(Vec<Value>, Vec<usize>)> {
        if let Some(end) = ends.last() {
            self.at = *end;
        } else {
            if !self.eat(b'[') {
                return None;
            }
            self.skip_space();
            if self.eat(b']') {
                return Some((elements, ends));
            }
            elements.push(self.value(2)?);
            ends.push(self.at);
        }
        loop {
            self.skip_space();
            if self.eat(b']') {
                return Some((elements, ends));
            }
            if !self.eat(b',') {
                return None;
            }
            self.skip_space();
            elements.push(self.value(2)?);
            ends.push(self.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversation's elements as the body holds them: between brackets they parse to
    /// the parsed conversation, first body of an agent or a later one alike.
    #[test]
    fn conversation_items_are_the_arrays_elements() {
        let first = Bytes::from_static(
            b"{\"model\": \"m\", \"input\": [ {\"role\": \"user\", \"content\": \"a\"} ,\n {\"type\": \"x\"}], \"store\": true}",
        );
        let second = Bytes::from_static(
            b"{\"model\": \"m\", \"input\": [ {\"role\": \"user\", \"content\": \"a\"} ,\n {\"type\": \"x\"},{\"type\":\"y\"}], \"store\": true}",
        );
        let empty = Bytes::from_static(b"{\"input\": [ ]}");
        let mut previous = None;
        let mut read = 0;
        for (bytes, count) in [(first, 2), (second, 3), (empty, 0)] {
            let parsed = parse_body(Api::OpenAiResponses, bytes, previous.take()).unwrap();
            if let Some(items) = parsed.conversation_items() {
                read += 1;
                let array: Value =
                    serde_json::from_slice(&[b"[", items, b"]"].concat()).expect("items");
                assert_eq!(array, parsed.value()["input"]);
                assert_eq!(array.as_array().map(Vec::len), Some(count));
            }
            previous = Some(parsed);
        }
        assert_eq!(read, 3, "every body had its layout");
    }

    /// A JSON string literal of UTF-16 code units as JavaScript's `JSON.stringify` writes it:
    /// printable ASCII as itself, everything else (lone surrogates included) as `\uXXXX`.
    fn js_string(units: &[u16]) -> String {
        let mut out = String::from("\"");
        for unit in units {
            match char::from_u32(u32::from(*unit)) {
                Some(c) if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' => out.push(c),
                _ => out.push_str(&format!("\\u{unit:04x}")),
            }
        }
        out.push('"');
        out
    }

    #[test]
    fn lone_surrogate_escapes_become_replacement_characters() {
        let cases = [
            (r#"{"t":"cut \ud83d"}"#, "cut \u{fffd}"),
            (r#"{"t":"\ude00 tail"}"#, "\u{fffd} tail"),
            (r#"{"t":"\ud83d\ud83d\ude00"}"#, "\u{fffd}\u{1f600}"),
            (r#"{"t":"\\\ud83d"}"#, "\\\u{fffd}"),
        ];
        for (body, text) in cases {
            let fixed = replace_lone_surrogates(Bytes::from(body));
            assert_eq!(fixed.len(), body.len(), "rewritten in place: {body}");
            let value: Value = serde_json::from_slice(&fixed).expect("parses");
            assert_eq!(value["t"], text, "{body}");
        }
        // Nothing to replace: a pair, an escaped backslash before `ud83d`, no escape at all.
        for body in [
            r#"{"t":"\ud83d\ude00"}"#,
            r#"{"t":"\\ud83d"}"#,
            r#"{"t":"plain"}"#,
        ] {
            assert_eq!(lone_surrogates_replaced(body.as_bytes()), None, "{body}");
        }
    }

    proptest::proptest! {
        /// Any sequence of UTF-16 code units, written as JavaScript would, parses after the
        /// rewrite to what lossy UTF-16 decoding gives (one U+FFFD per lone surrogate).
        #[test]
        fn any_utf16_string_parses_as_lossy_utf16(
            units in proptest::collection::vec(
                proptest::prop_oneof![
                    0x20u16..0x7f,
                    0xd800u16..0xdc00,
                    0xdc00u16..0xe000,
                    0x00u16..0x20,
                    0xe000u16..=0xffff,
                ],
                0..24,
            )
        ) {
            let body = format!("{{\"t\":{}}}", js_string(&units));
            let fixed = replace_lone_surrogates(Bytes::from(body.clone()));
            let value: Value = serde_json::from_slice(&fixed)
                .map_err(|error| proptest::test_runner::TestCaseError::fail(format!("{body}: {error}")))?;
            let expected = String::from_utf16_lossy(&units);
            proptest::prop_assert_eq!(value["t"].as_str(), Some(expected.as_str()));
        }
    }

    fn parse(body: &str, previous: Option<ParsedBody>) -> ParsedBody {
        parse_body(Api::Anthropic, Bytes::from(body.to_string()), previous).unwrap()
    }

    #[test]
    fn takes_over_the_unchanged_elements() {
        let first = parse(
            r#"{"model":"m","messages":[{"a":1},{"b":"x"}],"tools":[]}"#,
            None,
        );
        assert_eq!(first.reused_elements(), 0);
        let body = r#"{"model":"m","messages":[{"a":1},{"b":"x"}, {"c":[1,2]} ],"tools":[], "stream":true}"#;
        let second = parse(body, Some(first));
        assert_eq!(second.reused_elements(), 2);
        assert_eq!(
            second.value(),
            &serde_json::from_str::<Value>(body).unwrap()
        );
        let body = r#"{"model":"m","messages":[{"a":1},{"b":"x"}]}"#;
        let third = parse(body, Some(second));
        assert_eq!(third.reused_elements(), 2);
        assert_eq!(third.value(), &serde_json::from_str::<Value>(body).unwrap());
    }

    #[test]
    fn a_number_needs_the_byte_after_it() {
        let first = parse(r#"{"messages":[1,"s",2]}"#, None);
        let body = r#"{"messages":[1,"s",23]}"#;
        let second = parse(body, Some(first));
        assert_eq!(second.reused_elements(), 2);
        assert_eq!(
            second.value(),
            &serde_json::from_str::<Value>(body).unwrap()
        );
        let body = r#"{"messages":[12]}"#;
        let third = parse(body, Some(second));
        assert_eq!(third.reused_elements(), 0);
        assert_eq!(third.value(), &serde_json::from_str::<Value>(body).unwrap());
    }

    #[test]
    fn unchanged_trailing_members_are_taken_over() {
        let first = parse(
            r#"{"messages":[{"a":1}],"system":"s","tools":[{"name":"Bash"}],"stream":true}"#,
            None,
        );
        let body = r#"{"messages":[{"a":1},{"b":2}],"system":"s","tools":[{"name":"Bash"}],"stream":true}"#;
        let second = parse(body, Some(first));
        let layout = second.layout.as_ref().expect("a layout");
        let names: Vec<&str> = layout
            .trailing
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(names, ["system", "tools"], "literals are not kept");
        assert_eq!(
            second.value(),
            &serde_json::from_str::<Value>(body).unwrap()
        );
        // A changed value, or one that only starts the same, is parsed.
        let body = r#"{"messages":[{"a":1},{"b":2}],"system":"s2","tools":[{"name":"Bash"},1]}"#;
        let third = parse(body, Some(second));
        assert_eq!(
            serde_json::to_string(third.value()).unwrap(),
            serde_json::to_string(&serde_json::from_str::<Value>(body).unwrap()).unwrap()
        );
    }

    #[test]
    fn a_changed_prefix_member_reuses_nothing() {
        let first = parse(r#"{"model":"m","messages":[{"a":1}]}"#, None);
        let body = r#"{"model":"n","messages":[{"a":1}]}"#;
        let second = parse(body, Some(first));
        assert_eq!(second.reused_elements(), 0);
        assert_eq!(
            second.value(),
            &serde_json::from_str::<Value>(body).unwrap()
        );
    }

    #[test]
    fn duplicated_keys_resolve_like_a_whole_parse() {
        let body = r#"{"messages":[{"a":1}],"model":"m","messages":[{"b":2}],"model":"z"}"#;
        let first = parse(body, None);
        assert_eq!(first.value(), &serde_json::from_str::<Value>(body).unwrap());
        assert!(first.layout.is_none());
    }

    #[test]
    fn nesting_is_bounded_as_in_a_whole_parse() {
        for depth in 120..132 {
            for body in [
                format!(
                    r#"{{"messages":[{}1{}]}}"#,
                    "[".repeat(depth),
                    "]".repeat(depth)
                ),
                format!(r#"{{"tools":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth)),
            ] {
                let whole = serde_json::from_slice::<Value>(body.as_bytes());
                let parsed = parse_body(Api::Anthropic, Bytes::from(body.clone()), None);
                assert_eq!(whole.is_ok(), parsed.is_ok(), "depth {depth}: {body}");
            }
        }
    }

    #[test]
    fn errors_are_the_whole_parse_errors() {
        let first = parse(r#"{"model":"m","messages":[{"a":1},{"b":2}]}"#, None);
        let error = parse_body(
            Api::Anthropic,
            Bytes::from_static(br#"{"model":"m","messages":[{"a":1},{"b":2},]}"#),
            Some(first),
        )
        .unwrap_err();
        let whole = body_object(
            Api::Anthropic,
            br#"{"model":"m","messages":[{"a":1},{"b":2},]}"#,
        )
        .unwrap_err();
        assert_eq!(error.to_string(), whole.to_string());
    }
}
