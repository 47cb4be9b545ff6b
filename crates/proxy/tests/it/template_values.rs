//! `ChatTemplate::render` builds its context straight as template values
//! (`Message::template_value`). The reference here writes the HF-convention dicts as JSON
//! (`view` below) and renders them through `render_context`. Both must render the same bytes
//! for any conversation, in both tool-argument forms, through a template that prints every
//! message as JSON (key order, types) and as Python's `str()`.

use gyre_proxy::messages::Reasoning;
use gyre_proxy::{
    ChatTemplate, Message, RenderInput, Role, SpecialTokens, Tool, ToolArgumentsForm, ToolCall,
};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use crate::support::reference_now;

const PRINT_ALL: &str = "{% for m in messages %}{{ m | tojson }}\n{{ m }}\n\
{% for c in m.tool_calls %}{{ c.function.arguments is string }}{{ c.function.arguments }}{% endfor %}\n\
{% endfor %}{{ tools | tojson }}{{ add_generation_prompt }}{{ bos_token }}{{ flag }}";

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z {}\":,0-9\\[\\]\\\\]{0,24}",
        Just(String::new()),
        Just("{\"b\": 1, \"a\": [true, null, 2.5]}".to_string()),
        Just("héllo \u{1F600} \"quoted\"\n".to_string()),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    (
        0..4usize,
        text(),
        proptest::collection::vec((text(), proptest::option::of(text()), any::<bool>()), 0..3),
        proptest::collection::vec((text(), text(), text()), 0..3),
        proptest::option::of(text()),
        proptest::option::of(text()),
        any::<bool>(),
    )
        .prop_map(
            |(role, content, reasoning, calls, tool_call_id, tool_name, is_error)| Message {
                role: [Role::System, Role::User, Role::Assistant, Role::Tool][role],
                content,
                reasoning: reasoning
                    .into_iter()
                    .map(|(text, handle, redacted)| Reasoning {
                        text,
                        handle,
                        redacted,
                    })
                    .collect(),
                tool_calls: calls
                    .into_iter()
                    .map(|(id, name, arguments)| ToolCall {
                        id,
                        name,
                        arguments,
                    })
                    .collect(),
                tool_call_id,
                tool_name,
                is_error,
            },
        )
}

fn tool() -> impl Strategy<Value = Tool> {
    (text(), proptest::option::of(text())).prop_map(|(name, description)| Tool {
        name,
        description,
        parameters: json!({"type": "object", "properties": {"z": {"type": "integer"}, "a": {}}}),
    })
}

/// The dict HF templates expect for a message, written independently of the library.
fn view(message: &Message, form: ToolArgumentsForm) -> Value {
    let mut view = Map::new();
    view.insert("role".into(), json!(message.role.as_str()));
    view.insert("content".into(), json!(message.content));
    if let Some(reasoning) = message.reasoning_content() {
        view.insert("reasoning_content".into(), json!(reasoning));
    }
    if !message.tool_calls.is_empty() {
        let calls: Vec<Value> = message
            .tool_calls
            .iter()
            .map(|call| {
                let arguments = match form {
                    ToolArgumentsForm::RawText => json!(call.arguments),
                    ToolArgumentsForm::Object => serde_json::from_str(&call.arguments)
                        .unwrap_or_else(|_| json!(call.arguments)),
                };
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                })
            })
            .collect();
        view.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        view.insert("tool_call_id".into(), json!(id));
    }
    if let Some(name) = &message.tool_name {
        view.insert("name".into(), json!(name));
    }
    Value::Object(view)
}

fn reference(
    template: &ChatTemplate,
    messages: &[Message],
    tools: &[Tool],
    form: ToolArgumentsForm,
    extra: &Map<String, Value>,
) -> String {
    let mut context = extra.clone();
    context.insert("bos_token".into(), json!("<s>"));
    context.insert(
        "messages".into(),
        Value::Array(messages.iter().map(|m| view(m, form)).collect()),
    );
    context.insert(
        "tools".into(),
        if tools.is_empty() {
            Value::Null
        } else {
            Value::Array(tools.iter().map(Tool::template_view).collect())
        },
    );
    context.insert("add_generation_prompt".into(), json!(true));
    template
        .render_context(context, reference_now())
        .expect("the reference renders")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn direct_values_render_like_the_serde_reference(
        messages in proptest::collection::vec(message(), 0..5),
        tools in proptest::collection::vec(tool(), 0..3),
        object_form in any::<bool>(),
        flag in proptest::option::of(text()),
    ) {
        let form = if object_form { ToolArgumentsForm::Object } else { ToolArgumentsForm::RawText };
        let special = SpecialTokens { bos_token: Some("<s>".into()), ..SpecialTokens::default() };
        let template = ChatTemplate::new(PRINT_ALL, special, form).expect("compiles");
        let mut extra = Map::new();
        if let Some(flag) = flag {
            extra.insert("flag".into(), Value::from(flag));
        }
        let direct = template
            .render(&RenderInput {
                messages: &messages,
                tools: &tools,
                add_generation_prompt: true,
                now: reference_now(),
                extra: Some(&extra),
            })
            .expect("renders");
        prop_assert_eq!(direct, reference(&template, &messages, &tools, form, &extra));
    }
}
