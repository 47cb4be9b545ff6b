//! `body::parse_body` parses a body against the agent's previous one and takes over the
//! conversation elements the two share byte for byte. Its result must be exactly a
//! whole-document parse: the same value with the same key order, and for bytes that are not a
//! JSON object, the same error. The bodies here go through the edits harnesses make (append
//! turns, rewrite the last turn, move `cache_control`, change trailing members, rewind after a
//! compaction) and through corruption (flipped, cut and inserted bytes).

use bytes::Bytes;
use gyre_proxy::body::{parse_body, ParsedBody};
use gyre_proxy::Api;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z {}\":,0-9\\[\\]\\\\]{0,16}",
        Just(String::new()),
        Just("héllo \u{1F600} \"quoted\"\n\t\u{1}".to_string()),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        text().prop_map(Value::String),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(("[a-z_]{1,6}", inner), 0..4)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A conversation element: mostly message objects, sometimes a bare value (the reader must
/// not care what the elements are).
fn element() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (text(), value()).prop_map(|(content, extra)| json!({
            "role": "user", "content": content, "extra": extra
        })),
        1 => value(),
        1 => any::<u32>().prop_map(Value::from),
    ]
}

#[derive(Clone, Debug)]
enum Edit {
    Append(Vec<Value>),
    RewriteLast(Value),
    Truncate(usize),
    Trailing(Value),
    Model(String),
    Pretty(bool),
    /// A digit appended to a last element that is a number (`1` becomes `12`).
    Digit(u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => proptest::collection::vec(element(), 1..4).prop_map(Edit::Append),
        2 => element().prop_map(Edit::RewriteLast),
        1 => (0..6usize).prop_map(Edit::Truncate),
        1 => value().prop_map(Edit::Trailing),
        1 => "[a-z]{1,4}".prop_map(Edit::Model),
        1 => any::<bool>().prop_map(Edit::Pretty),
        1 => (0..10u8).prop_map(Edit::Digit),
    ]
}

struct Conversation {
    model: String,
    messages: Vec<Value>,
    trailing: Value,
    pretty: bool,
}

impl Conversation {
    fn body(&self) -> Vec<u8> {
        // Members before and after the conversation, as Claude Code sends them.
        let mut object = Map::new();
        object.insert("model".into(), Value::String(self.model.clone()));
        object.insert("messages".into(), Value::Array(self.messages.clone()));
        object.insert("tools".into(), self.trailing.clone());
        object.insert("stream".into(), Value::Bool(true));
        let value = Value::Object(object);
        if self.pretty {
            serde_json::to_vec_pretty(&value).unwrap()
        } else {
            serde_json::to_vec(&value).unwrap()
        }
    }

    fn apply(&mut self, edit: &Edit) {
        match edit {
            Edit::Append(elements) => self.messages.extend(elements.iter().cloned()),
            Edit::RewriteLast(element) => {
                self.messages.pop();
                self.messages.push(element.clone());
            }
            Edit::Truncate(keep) => self.messages.truncate(*keep),
            Edit::Trailing(value) => self.trailing = value.clone(),
            Edit::Model(model) => self.model = model.clone(),
            Edit::Pretty(pretty) => self.pretty = *pretty,
            Edit::Digit(digit) => {
                if let Some(last @ Value::Number(_)) = self.messages.last_mut() {
                    if let Ok(longer) = serde_json::from_str(&format!("{last}{digit}")) {
                        *last = longer;
                    }
                }
            }
        }
    }
}

/// The whole-document parse's verdict, as `parse_body` must give it: the value's text, or the
/// error the request parser gives for bytes that are not a JSON object. Both read lone
/// UTF-16 surrogate escapes as U+FFFD.
fn whole(bytes: &[u8]) -> Result<String, String> {
    let cleaned = gyre_proxy::body::replace_lone_surrogates(Bytes::copy_from_slice(bytes));
    match serde_json::from_slice::<Value>(&cleaned) {
        Ok(value) if value.is_object() => Ok(serde_json::to_string(&value).unwrap()),
        _ => Err(gyre_proxy::anthropic::parse_request(bytes)
            .expect_err("not a JSON object")
            .to_string()),
    }
}

/// Parses `bytes` against `previous` and checks it against the whole-document parse; returns
/// the parsed body to seed the next one.
fn check(bytes: &[u8], previous: Option<ParsedBody>) -> Result<Option<ParsedBody>, TestCaseError> {
    let expected = whole(bytes);
    match parse_body(Api::Anthropic, Bytes::copy_from_slice(bytes), previous) {
        Ok(parsed) => {
            // Key order matters (tool inputs render in the order sent): compare the text.
            prop_assert_eq!(Ok(serde_json::to_string(parsed.value()).unwrap()), expected);
            Ok(Some(parsed))
        }
        Err(error) => {
            prop_assert_eq!(Err(error.to_string()), expected);
            Ok(None)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn edited_bodies_parse_as_whole_documents(
        start in proptest::collection::vec(element(), 0..5),
        edits in proptest::collection::vec(edit(), 1..8),
    ) {
        let mut conversation = Conversation {
            model: "m".into(),
            messages: start,
            trailing: json!([]),
            pretty: false,
        };
        let mut previous = check(&conversation.body(), None)?;
        for edit in &edits {
            let before = conversation.messages.len();
            let same_form = !matches!(edit, Edit::Model(_) | Edit::Pretty(_));
            conversation.apply(edit);
            let parsed = check(&conversation.body(), previous.take())?;
            let parsed = parsed.expect("a serialised object parses");
            // Appending to a compact body reuses every element that was there.
            if matches!(edit, Edit::Append(_)) && same_form && !conversation.pretty {
                prop_assert!(
                    parsed.reused_elements() + 1 >= before,
                    "reused {} of {}", parsed.reused_elements(), before
                );
            }
            previous = Some(parsed);
        }
    }

    #[test]
    fn corrupted_bodies_get_the_whole_document_verdict(
        start in proptest::collection::vec(element(), 1..6),
        more in proptest::collection::vec(element(), 1..3),
        damage in 0..3usize,
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut conversation = Conversation {
            model: "m".into(),
            messages: start,
            trailing: json!({"b": 1}),
            pretty: false,
        };
        let previous = check(&conversation.body(), None)?;
        conversation.apply(&Edit::Append(more));
        let mut bytes = conversation.body();
        let at = at.index(bytes.len());
        match damage {
            0 => bytes[at] ^= byte | 1,
            1 => bytes.truncate(at),
            _ => bytes.insert(at, byte),
        }
        check(&bytes, previous)?;
    }
}

#[test]
fn a_whitespace_only_or_non_object_body_is_refused_as_before() {
    for body in [&b"  "[..], b"[1]", b"\"s\"", b"{\"a\":1} x", b"{\"a\" 1}"] {
        let expected = gyre_proxy::anthropic::parse_request(body)
            .unwrap_err()
            .to_string();
        let got = parse_body(Api::Anthropic, Bytes::copy_from_slice(body), None)
            .unwrap_err()
            .to_string();
        assert_eq!(got, expected);
    }
}

#[test]
fn a_long_conversation_parses_only_its_new_turns() {
    let mut conversation = Conversation {
        model: "m".into(),
        messages: (0..200)
            .map(|turn| json!({"role": "user", "content": format!("turn {turn}")}))
            .collect(),
        trailing: json!([{"name": "Bash"}]),
        pretty: false,
    };
    let first = parse_body(Api::Anthropic, Bytes::from(conversation.body()), None).unwrap();
    assert_eq!((first.elements(), first.reused_elements()), (200, 0));
    conversation.apply(&Edit::Append(vec![
        json!({"role": "assistant", "content": "ok"}),
        json!({"role": "user", "content": "next"}),
    ]));
    let second = parse_body(
        Api::Anthropic,
        Bytes::from(conversation.body()),
        Some(first),
    )
    .unwrap();
    assert_eq!((second.elements(), second.reused_elements()), (202, 200));
}

/// A body of very many top-level members (a hostile one: real bodies have a dozen or two) is
/// parsed whole each time instead of matched member by member against the previous one,
/// which would cost time quadratic in the members. Its value is the same either way.
#[test]
fn a_body_of_many_members_is_not_matched_against_the_previous_one() {
    let body = |turns: usize| {
        let mut object = serde_json::Map::new();
        object.insert("model".into(), json!("m"));
        object.insert(
            "messages".into(),
            Value::Array(
                (0..turns)
                    .map(|turn| json!({"role": "user", "content": format!("turn {turn}")}))
                    .collect(),
            ),
        );
        for member in 0..5_000 {
            object.insert(format!("k{member}"), json!(""));
        }
        Value::Object(object).to_string().into_bytes()
    };
    let first = parse_body(Api::Anthropic, Bytes::from(body(3)), None).unwrap();
    let second = parse_body(Api::Anthropic, Bytes::from(body(4)), Some(first)).unwrap();
    assert_eq!(second.reused_elements(), 0);
    assert_eq!(second.elements(), 4);
    assert_eq!(
        whole(&body(4)),
        Ok(serde_json::to_string(second.value()).unwrap())
    );
}
