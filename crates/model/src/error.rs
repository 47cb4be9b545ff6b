//! The model crate's one error type.

use gyre_engine::EngineError;

/// Everything the embedded policy can reject or fail at.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid model config: {field}: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    #[error("invalid input: {message}")]
    Input { message: String },
    #[error("weights: {message}")]
    Weights { message: String },
    #[error("tensor backend: {0}")]
    Backend(#[from] candle_core::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("gguf / tokenizer: {message}")]
    Pretrained { message: String },
}

impl ModelError {
    pub fn config(field: &'static str, message: impl Into<String>) -> Self {
        Self::Config {
            field,
            message: message.into(),
        }
    }

    pub fn input(message: impl Into<String>) -> Self {
        Self::Input {
            message: message.into(),
        }
    }

    pub fn weights(message: impl Into<String>) -> Self {
        Self::Weights {
            message: message.into(),
        }
    }
}
