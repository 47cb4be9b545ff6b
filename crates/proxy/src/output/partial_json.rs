//! Closing a JSON text that was cut off: what a tool call's arguments look like when the model
//! hit its token limit while writing them.
//!
//! [`close_partial_object`] keeps everything up to the last point where the text can be closed
//! into valid JSON, and closes it: an open string value keeps what was written of it (an
//! escape cut in half is dropped), a key without its value, a dangling `,` or `:` and a cut
//! literal or number (`tru`, `-`, `1.`) are dropped, open arrays and objects are closed. A
//! complete object comes back unchanged. This is the shape a client assembling streamed
//! partial JSON ends with (Anthropic's `input_json_delta`, OpenAI's argument deltas).

/// A container open at some point of the scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Object,
    Array,
}

/// Where in an object's `key: value` pair the scan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// After `{` or `,`: a key (or `}`) comes next.
    Key,
    /// After a key: `:` comes next.
    Colon,
    /// After `:` (or in an array, after `[` / `,`): a value comes next.
    Value,
    /// After a value: `,` or the closer comes next.
    After,
}

/// `text` (which starts with `{`, possibly after white space) closed into a JSON object, or
/// `None` when it does not start an object or holds something no JSON prefix holds.
pub fn close_partial_object(text: &str) -> Option<String> {
    let trimmed = text.trim_start();
    if !trimmed.starts_with('{') {
        return None;
    }
    let bytes = trimmed.as_bytes();
    let mut stack: Vec<(Open, Slot)> = Vec::new();
    // The longest prefix that closes cleanly, and the stack to close it with (None: not yet).
    let mut safe: Option<(usize, Vec<(Open, Slot)>)> = None;
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' => at += 1,
            b'{' | b'[' => {
                if let Some(top) = stack.last() {
                    if top.1 != Slot::Value {
                        return None;
                    }
                }
                let open = if byte == b'{' {
                    (Open::Object, Slot::Key)
                } else {
                    (Open::Array, Slot::Value)
                };
                stack.push(open);
                at += 1;
                safe = Some((at, stack.clone()));
            }
            b'}' | b']' => {
                let (open, slot) = stack.pop()?;
                let fits = match (open, byte) {
                    (Open::Object, b'}') => matches!(slot, Slot::Key | Slot::After),
                    (Open::Array, b']') => matches!(slot, Slot::Value | Slot::After),
                    _ => false,
                };
                if !fits {
                    return None;
                }
                at += 1;
                match stack.last_mut() {
                    Some(top) => top.1 = Slot::After,
                    None => {
                        // The object is complete: whatever follows is not part of it.
                        return serde_json::from_str::<serde_json::Value>(&trimmed[..at])
                            .ok()
                            .map(|_| trimmed[..at].to_string());
                    }
                }
                safe = Some((at, stack.clone()));
            }
            b',' => {
                let top = stack.last_mut()?;
                if top.1 != Slot::After {
                    return None;
                }
                top.1 = match top.0 {
                    Open::Object => Slot::Key,
                    Open::Array => Slot::Value,
                };
                at += 1;
            }
            b':' => {
                let top = stack.last_mut()?;
                if top.1 != Slot::Colon {
                    return None;
                }
                top.1 = Slot::Value;
                at += 1;
            }
            b'"' => {
                let top = *stack.last()?;
                let is_key = top.1 == Slot::Key;
                if !is_key && top.1 != Slot::Value {
                    return None;
                }
                // Scan the string; `end` is past its closing quote if it has one.
                let mut cursor = at + 1;
                let mut closed = false;
                // The last position inside the string that does not cut an escape.
                let mut whole_up_to = cursor;
                while cursor < bytes.len() {
                    match bytes[cursor] {
                        b'"' => {
                            closed = true;
                            cursor += 1;
                            break;
                        }
                        b'\\' => {
                            let escape_len = match bytes.get(cursor + 1) {
                                Some(b'u') => 6,
                                Some(_) => 2,
                                None => 2,
                            };
                            if cursor + escape_len > bytes.len() {
                                cursor = bytes.len();
                                break;
                            }
                            cursor += escape_len;
                            whole_up_to = cursor;
                        }
                        _ => {
                            cursor += 1;
                            whole_up_to = cursor;
                        }
                    }
                }
                if closed {
                    let top = stack.last_mut()?;
                    top.1 = if is_key { Slot::Colon } else { Slot::After };
                    at = cursor;
                    if !is_key {
                        safe = Some((at, stack.clone()));
                    }
                } else {
                    if !is_key {
                        // A value cut inside: keep what was written of it, closed. A high
                        // surrogate escape whose low half was cut off is dropped (alone it is
                        // not JSON); if the text still does not close, the value goes too.
                        let mut closing = stack.clone();
                        if let Some(top) = closing.last_mut() {
                            top.1 = Slot::After;
                        }
                        let mut kept = &trimmed[..whole_up_to];
                        if let Some(escape) =
                            kept.len().checked_sub(6).and_then(|at| kept.get(at..))
                        {
                            if is_high_surrogate_escape(escape) {
                                kept = &kept[..kept.len() - 6];
                            }
                        }
                        if let Some(closed) = close(&format!("{kept}\""), &closing) {
                            return Some(closed);
                        }
                        break;
                    }
                    break;
                }
            }
            _ => {
                // A literal or a number: up to the next delimiter.
                let top = *stack.last()?;
                if top.1 != Slot::Value {
                    return None;
                }
                let end = bytes[at..]
                    .iter()
                    .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                    .map_or(bytes.len(), |offset| at + offset);
                let token = &trimmed[at..end];
                let complete_token = end < bytes.len();
                if serde_json::from_str::<serde_json::Value>(token).is_err() {
                    if complete_token {
                        return None;
                    }
                    break;
                }
                // A number at the very end may have gone on (`12` of `123`): it is kept as
                // written.
                if let Some(top) = stack.last_mut() {
                    top.1 = Slot::After;
                }
                at = end;
                safe = Some((at, stack.clone()));
            }
        }
    }
    let (end, open) = safe?;
    close(&trimmed[..end], &open)
}

/// Whether `escape` is `\uD800`..`\uDBFF`: the first half of a surrogate pair.
fn is_high_surrogate_escape(escape: &str) -> bool {
    escape
        .strip_prefix("\\u")
        .and_then(|hex| u16::from_str_radix(hex, 16).ok())
        .is_some_and(|unit| (0xD800..0xDC00).contains(&unit))
}

/// `prefix` with the closers of `open` appended, checked to be a JSON object.
fn close(prefix: &str, open: &[(Open, Slot)]) -> Option<String> {
    let mut closed = prefix.trim_end().to_string();
    for (container, _) in open.iter().rev() {
        closed.push(match container {
            Open::Object => '}',
            Open::Array => ']',
        });
    }
    match serde_json::from_str::<serde_json::Value>(&closed) {
        Ok(serde_json::Value::Object(_)) => Some(closed),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::close_partial_object;

    #[test]
    fn cut_texts_close_to_what_was_written() {
        for (cut, closed) in [
            (r#"{"#, r#"{}"#),
            (r#"{"city""#, r#"{}"#),
            (r#"{"city": "Par"#, r#"{"city": "Par"}"#),
            (r#"{"city": "Paris", "#, r#"{"city": "Paris"}"#),
            (r#"{"a": [1, 2"#, r#"{"a": [1, 2]}"#),
            (r#"{"a": [1, 2,"#, r#"{"a": [1, 2]}"#),
            (r#"{"a": tru"#, r#"{}"#),
            (r#"{"a": true, "b": -"#, r#"{"a": true}"#),
            (r#"{"a": "x\"#, r#"{"a": "x"}"#),
            (r#"{"a": "x\u00"#, r#"{"a": "x"}"#),
            (r#"{"a": "x\ud83d"#, r#"{"a": "x"}"#),
            (r#"{"a": "x\ud83d\ude00"#, r#"{"a": "x\ud83d\ude00"}"#),
            (r#"{"a": "x\ud83d\ude"#, r#"{"a": "x"}"#),
            (r#"{"a": {"b": {"c": "d"#, r#"{"a": {"b": {"c": "d"}}}"#),
            (r#"{"a": 1}"#, r#"{"a": 1}"#),
            (r#"{"a": 1} trailing"#, r#"{"a": 1}"#),
        ] {
            assert_eq!(close_partial_object(cut).as_deref(), Some(closed), "{cut}");
        }
        // Every cut of a text full of escapes closes to an object (never `None`, never text).
        let whole =
            r#"{"a": "x\ud83d\ude00y", "b": [1, {"c": "\u00e9\n\"q\""}], "d": -1.5e3, "e": null}"#;
        for cut in (1..=whole.len()).filter(|at| whole.is_char_boundary(*at)) {
            let closed = close_partial_object(&whole[..cut])
                .unwrap_or_else(|| panic!("cut at {cut} did not close: {}", &whole[..cut]));
            let value: serde_json::Value = serde_json::from_str(&closed).expect("JSON");
            assert!(value.is_object(), "{closed}");
        }
        for refused in ["", "[1", "nope", r#"{"a" 1"#, r#"{]"#] {
            assert_eq!(close_partial_object(refused), None, "{refused}");
        }
    }
}
