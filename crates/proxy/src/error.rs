//! The crate's error type for everything that is not a rejected API request (those are
//! [`crate::ApiError`] values): model directories, templates, tokenizers.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{path}: {message}")]
    ModelFile { path: PathBuf, message: String },
    #[error("{path}: field `{field}`: {message}")]
    ModelField {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("chat template: {message}")]
    Template { message: String },
    #[error("tokenizer: {message}")]
    Tokenizer { message: String },
    #[error("engine: {message}")]
    Engine { message: String },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
}
