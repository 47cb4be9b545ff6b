//! Continuing a final assistant message (Anthropic's prefill: the request ends with the start
//! of the answer, and the model writes the rest), the way Hugging Face's
//! `apply_chat_template(continue_final_message=True)` does it: the conversation is rendered
//! without the generation prompt, so the final message is the last thing rendered, and the
//! text is cut right after that message's content, dropping the end-of-turn marker the
//! template closed it with.

use crate::ProxyError;

/// `rendered` (a conversation rendered without the generation prompt) cut right after the
/// last occurrence of `content`, the final message's text. As in transformers, the content is
/// looked for without its surrounding white space (templates that trim it still match) and
/// kept with its leading white space when the template rendered it. A content that is empty
/// or that the template did not render is an error: the template cannot continue it.
pub fn continue_final_message(mut rendered: String, content: &str) -> Result<String, ProxyError> {
    let trimmed = content.trim();
    let found = (!trimmed.is_empty())
        .then(|| rendered.rfind(trimmed))
        .flatten();
    let Some(at) = found else {
        return Err(ProxyError::Template {
            message: "the chat template cannot continue a final assistant message: its \
                      text does not appear in the rendered prompt (a prefill must hold text \
                      the template renders as it is)"
                .into(),
        });
    };
    let leading_kept = content.trim_start();
    let end = if rendered[at..].starts_with(leading_kept) {
        at + leading_kept.len()
    } else {
        at + trimmed.len()
    };
    rendered.truncate(end);
    Ok(rendered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_ends_right_after_the_final_content() {
        let rendered = "<|im_start|>user\nThe answer is?<|im_end|>\n<|im_start|>assistant\nThe answer is<|im_end|>\n";
        assert_eq!(
            continue_final_message(rendered.into(), "The answer is").expect("continues"),
            "<|im_start|>user\nThe answer is?<|im_end|>\n<|im_start|>assistant\nThe answer is"
        );
        // A template that trims the content still matches it.
        let trimmed = "<|im_start|>assistant\nhello<|im_end|>\n";
        assert_eq!(
            continue_final_message(trimmed.into(), "  hello").expect("continues"),
            "<|im_start|>assistant\nhello"
        );
    }

    #[test]
    fn content_the_template_does_not_render_cannot_be_continued() {
        for content in ["", "  ", "not rendered"] {
            let Err(error) =
                continue_final_message("<|im_start|>assistant\n<|im_end|>\n".into(), content)
            else {
                panic!("{content:?} continued");
            };
            assert!(
                error
                    .to_string()
                    .contains("cannot continue a final assistant message"),
                "{error}"
            );
        }
    }
}
