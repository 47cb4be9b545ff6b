//! A rejected request as a value, rendered in the error format of the API it came in on.
//!
//! Anthropic: `{"type":"error","error":{"type":"invalid_request_error","message":"…"}}`.
//! OpenAI (both APIs): `{"error":{"message":"…","type":"invalid_request_error","param":…,
//! "code":…}}`. This is the one place that maps proxy errors to HTTP statuses.

use serde_json::{json, Value};

use crate::messages::Api;
use crate::output::sse::SseEvent;

/// What went wrong, independent of the API's words for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiErrorKind {
    /// Malformed JSON, wrong types, missing fields, unsupported content: 400.
    InvalidRequest,
    /// Unknown or closed execution credential: 401.
    Authentication,
    PermissionDenied,
    NotFound,
    /// A route called with a method it does not serve: 405.
    MethodNotAllowed,
    /// Body over the configured limit: 413.
    RequestTooLarge,
    /// The client stopped sending its body: 408.
    RequestTimeout,
    /// A `Content-Encoding` the proxy does not decode: 415.
    UnsupportedMediaType,
    RateLimited,
    /// A proxy bug or an engine failure that could not be retried: 500.
    Internal,
    /// No engine can take the request now: 529 (Anthropic) / 503 (OpenAI).
    Overloaded,
}

impl ApiErrorKind {
    /// The kind an OpenAI error's `code` names, as a Responses stream's `error` event carries
    /// it (`code`, or the type's name where the kind has no code): the inverse of
    /// [`ApiError::sse_event`]'s `code` for the OpenAI APIs. The codes the API names errors
    /// with more precisely than their kind (`context_length_exceeded`) are refusals of the
    /// request; a code the proxy never writes reads as its own failure.
    pub fn from_openai_code(code: &str) -> Self {
        match code {
            "invalid_request_error" | "context_length_exceeded" | "previous_response_not_found" => {
                Self::InvalidRequest
            }
            "invalid_api_key" => Self::Authentication,
            "permission_denied" | "permission_error" => Self::PermissionDenied,
            "not_found" => Self::NotFound,
            "method_not_allowed" => Self::MethodNotAllowed,
            "request_too_large" => Self::RequestTooLarge,
            "request_timeout" => Self::RequestTimeout,
            "unsupported_content_encoding" => Self::UnsupportedMediaType,
            "rate_limit_exceeded" | "rate_limit_error" => Self::RateLimited,
            "overloaded" => Self::Overloaded,
            _ => Self::Internal,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub api: Api,
    pub kind: ApiErrorKind,
    pub message: String,
    /// The offending field path (`messages[3].content[1].tool_use_id`), when there is one.
    pub param: Option<String>,
    /// OpenAI's `code` when the API names this error more precisely than its kind does
    /// (`previous_response_not_found`); Anthropic's `error.details.error_code`
    /// (`thread_not_found`).
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(api: Api, kind: ApiErrorKind, message: impl Into<String>) -> Self {
        Self {
            api,
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A prompt longer than the model's context window leaves room for (`prompt_tokens_max`),
    /// in the words each vendor uses, which the harnesses recognise and answer by compacting
    /// their conversation: Anthropic's `prompt is too long: N tokens > M maximum`, OpenAI's
    /// `context_length_exceeded` code.
    pub fn context_too_long(api: Api, prompt_tokens: usize, prompt_tokens_max: usize) -> Self {
        match api {
            Api::Anthropic => Self::new(
                api,
                ApiErrorKind::InvalidRequest,
                format!("prompt is too long: {prompt_tokens} tokens > {prompt_tokens_max} maximum"),
            ),
            Api::OpenAiChat | Api::OpenAiResponses => Self {
                api,
                kind: ApiErrorKind::InvalidRequest,
                message: format!(
                    "This model's maximum context length is {} tokens. However, your messages \
                     resulted in {prompt_tokens} tokens. Please reduce the length of the messages.",
                    prompt_tokens_max + 1
                ),
                param: Some(
                    if api == Api::OpenAiChat {
                        "messages"
                    } else {
                        "input"
                    }
                    .into(),
                ),
                code: Some("context_length_exceeded"),
            },
        }
    }

    /// A 400 about one field; the message starts with the field path.
    pub fn invalid_field(api: Api, path: impl Into<String>, problem: impl AsRef<str>) -> Self {
        let path = path.into();
        let message = if path.is_empty() {
            problem.as_ref().to_string()
        } else {
            format!("{path}: {}", problem.as_ref())
        };
        Self {
            api,
            kind: ApiErrorKind::InvalidRequest,
            message,
            param: (!path.is_empty()).then_some(path),
            code: None,
        }
    }

    pub fn request_too_large(api: Api, body_bytes_max: usize) -> Self {
        Self::new(
            api,
            ApiErrorKind::RequestTooLarge,
            format!("request body exceeds the limit of {body_bytes_max} bytes"),
        )
    }

    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match (self.kind, self.api) {
            (ApiErrorKind::InvalidRequest, _) => 400,
            (ApiErrorKind::Authentication, _) => 401,
            (ApiErrorKind::PermissionDenied, _) => 403,
            (ApiErrorKind::NotFound, _) => 404,
            (ApiErrorKind::MethodNotAllowed, _) => 405,
            (ApiErrorKind::RequestTooLarge, _) => 413,
            (ApiErrorKind::RequestTimeout, _) => 408,
            (ApiErrorKind::UnsupportedMediaType, _) => 415,
            (ApiErrorKind::RateLimited, _) => 429,
            (ApiErrorKind::Internal, _) => 500,
            (ApiErrorKind::Overloaded, Api::Anthropic) => 529,
            (ApiErrorKind::Overloaded, _) => 503,
        }
    }

    /// The API's name for the error type.
    pub fn type_name(&self) -> &'static str {
        match self.api {
            Api::Anthropic => match self.kind {
                ApiErrorKind::InvalidRequest => "invalid_request_error",
                ApiErrorKind::Authentication => "authentication_error",
                ApiErrorKind::PermissionDenied => "permission_error",
                ApiErrorKind::NotFound => "not_found_error",
                ApiErrorKind::MethodNotAllowed => "invalid_request_error",
                ApiErrorKind::RequestTooLarge => "request_too_large",
                ApiErrorKind::RequestTimeout => "timeout_error",
                ApiErrorKind::UnsupportedMediaType => "invalid_request_error",
                ApiErrorKind::RateLimited => "rate_limit_error",
                ApiErrorKind::Internal => "api_error",
                ApiErrorKind::Overloaded => "overloaded_error",
            },
            Api::OpenAiChat | Api::OpenAiResponses => match self.kind {
                ApiErrorKind::InvalidRequest
                | ApiErrorKind::Authentication
                | ApiErrorKind::NotFound
                | ApiErrorKind::MethodNotAllowed
                | ApiErrorKind::RequestTooLarge
                | ApiErrorKind::RequestTimeout
                | ApiErrorKind::UnsupportedMediaType => "invalid_request_error",
                ApiErrorKind::PermissionDenied => "permission_error",
                ApiErrorKind::RateLimited => "rate_limit_error",
                ApiErrorKind::Internal | ApiErrorKind::Overloaded => "server_error",
            },
        }
    }

    /// OpenAI's `code` field.
    fn openai_code(&self) -> Option<&'static str> {
        if self.code.is_some() {
            return self.code;
        }
        match self.kind {
            ApiErrorKind::InvalidRequest | ApiErrorKind::Internal => None,
            ApiErrorKind::Authentication => Some("invalid_api_key"),
            ApiErrorKind::PermissionDenied => Some("permission_denied"),
            ApiErrorKind::NotFound => Some("not_found"),
            ApiErrorKind::MethodNotAllowed => Some("method_not_allowed"),
            ApiErrorKind::RequestTooLarge => Some("request_too_large"),
            ApiErrorKind::RequestTimeout => Some("request_timeout"),
            ApiErrorKind::UnsupportedMediaType => Some("unsupported_content_encoding"),
            ApiErrorKind::RateLimited => Some("rate_limit_exceeded"),
            ApiErrorKind::Overloaded => Some("overloaded"),
        }
    }

    /// This error about a body whose array `field` the proxy expanded (the `held` elements it
    /// kept, then the request's own), said in the client's terms: `field[i]` of its own
    /// elements counts from its own first; a held element is named `held_name(i)` in the
    /// message and `{held_param}[i]` as the param.
    pub fn rebased(
        mut self,
        field: &str,
        held: usize,
        held_param: &str,
        held_name: impl Fn(usize) -> String,
    ) -> Self {
        let Some(param) = self.param.clone() else {
            return self;
        };
        let Some((index, rest)) = param
            .strip_prefix(field)
            .and_then(|tail| tail.strip_prefix('['))
            .and_then(|tail| tail.split_once(']'))
            .and_then(|(index, rest)| Some((index.parse::<usize>().ok()?, rest)))
        else {
            return self;
        };
        let expanded = format!("{field}[{index}]");
        let named = if index >= held {
            format!("{field}[{}]", index - held)
        } else {
            held_name(index)
        };
        self.message = self.message.replacen(&expanded, &named, 1);
        self.param = Some(if index >= held {
            format!("{named}{rest}")
        } else {
            format!("{held_param}[{index}]{rest}")
        });
        self
    }

    /// The response body as JSON.
    pub fn body_json(&self) -> Value {
        match self.api {
            Api::Anthropic => match self.code {
                // A stable code the SDKs branch on (`thread_not_found`).
                Some(code) => json!({
                    "type": "error",
                    "error": {
                        "type": self.type_name(),
                        "message": self.message,
                        "details": {"error_code": code},
                    },
                }),
                None => json!({
                    "type": "error",
                    "error": {"type": self.type_name(), "message": self.message},
                }),
            },
            Api::OpenAiChat | Api::OpenAiResponses => json!({
                "error": {
                    "message": self.message,
                    "type": self.type_name(),
                    "param": self.param,
                    "code": self.openai_code(),
                },
            }),
        }
    }

    /// The response body bytes.
    pub fn body(&self) -> String {
        self.body_json().to_string()
    }

    /// The error as an event inside an already started stream (Anthropic `event: error`,
    /// a Chat Completions `data:` chunk holding the error, Responses `event: error`).
    pub fn sse_event(&self, sequence_number: u64) -> SseEvent {
        match self.api {
            Api::Anthropic => SseEvent::named("error", self.body_json()),
            Api::OpenAiChat => SseEvent::unnamed(self.body_json()),
            Api::OpenAiResponses => SseEvent::named(
                "error",
                json!({
                    "type": "error",
                    "code": self.openai_code().unwrap_or(self.type_name()),
                    "message": self.message,
                    "param": self.param,
                    "sequence_number": sequence_number,
                }),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ApiErrorKind; 11] = [
        ApiErrorKind::InvalidRequest,
        ApiErrorKind::Authentication,
        ApiErrorKind::PermissionDenied,
        ApiErrorKind::NotFound,
        ApiErrorKind::MethodNotAllowed,
        ApiErrorKind::RequestTooLarge,
        ApiErrorKind::RequestTimeout,
        ApiErrorKind::UnsupportedMediaType,
        ApiErrorKind::RateLimited,
        ApiErrorKind::Internal,
        ApiErrorKind::Overloaded,
    ];

    /// The code a Responses stream's `error` event carries for `error`.
    fn stream_code(error: &ApiError) -> String {
        let event = error.sse_event(7).json().expect("JSON");
        event["code"].as_str().expect("a code").to_string()
    }

    #[test]
    fn a_stream_errors_code_reads_back_as_its_kind() {
        for kind in KINDS {
            let error = ApiError::new(Api::OpenAiResponses, kind, "m");
            let code = stream_code(&error);
            assert_eq!(ApiErrorKind::from_openai_code(&code), kind, "{code}");
        }
        for error in [
            ApiError::context_too_long(Api::OpenAiResponses, 10, 5),
            crate::stored_responses::not_found("resp_1", "never issued"),
        ] {
            let code = stream_code(&error);
            assert_eq!(ApiErrorKind::from_openai_code(&code), error.kind, "{code}");
        }
        assert_eq!(
            ApiErrorKind::from_openai_code("no_such_code"),
            ApiErrorKind::Internal
        );
    }
}
