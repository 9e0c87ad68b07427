//! fak's one error type. Every fallible Rust path returns [`FakError`]; the PyO3 boundary
//! (`rust/src/python/errors.rs`) maps each variant to one class of the `fak.FakError` tree.

use thiserror::Error;

/// All errors raised by the Rust core.
#[derive(Debug, Error)]
pub enum FakError {
    /// A GGUF file is malformed or unsupported. `offset` is the byte offset in the file where the
    /// problem was found (the start of the field that could not be read or was invalid).
    #[error("GGUF error at byte offset {offset}: {msg}")]
    Gguf { msg: String, offset: u64 },

    /// An operating-system I/O failure (open, mmap, read).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    /// A tensor type, architecture or feature that fak does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// The model file is readable but inconsistent (missing tensor, wrong shape, bad hyper-parameter).
    #[error("model error: {0}")]
    Model(String),

    /// A request that does not fit in the context window of `n_ctx` tokens: `param` is the
    /// argument at fault — `"prompt_ids"` (a prompt of `n_prompt` tokens leaves none to
    /// generate), `"max_tokens"` (the prompt fits, but not with `max_tokens` more) or
    /// `"token_ids"` (a `logits` call longer than the window).
    #[error("{}", context_length_message(param, *n_prompt, *max_tokens, *n_ctx))]
    ContextLength { param: String, n_prompt: usize, max_tokens: Option<usize>, n_ctx: usize },

    /// The paged KV cache has no free block for a sequence.
    #[error("KV cache full: {needed} more blocks needed, {free} free; lower concurrency or raise the KV cache size")]
    KvCacheFull { needed: usize, free: usize },

    /// A caller-supplied argument is out of range. Surfaces in Python as `ValueError`.
    #[error("invalid value for {param}: {msg}")]
    InvalidArgument { param: String, msg: String },

    /// A compute backend failed (CUDA driver error, kernel load, no usable GPU).
    #[error("{backend} backend: {msg}")]
    Backend { backend: String, msg: String },

    /// A model cannot be split into `n_shards` tensor-parallel shards: `tensor` (of block format
    /// `format`) would have to be cut inside a quantization block, or some shard would get no
    /// attention head or FFN column (`crate::parallel::plan`). fak never dequantizes to split.
    #[error("cannot split {tensor} ({format}) into {n_shards} tensor-parallel shards: {msg}")]
    Shard { tensor: String, format: String, n_shards: usize, msg: String },
}

impl FakError {
    /// Shorthand for a [`FakError::Gguf`] at `offset`.
    pub fn gguf(offset: u64, msg: impl Into<String>) -> Self {
        FakError::Gguf { msg: msg.into(), offset }
    }
    /// Shorthand for a [`FakError::InvalidArgument`].
    pub fn invalid(param: impl Into<String>, msg: impl Into<String>) -> Self {
        FakError::InvalidArgument { param: param.into(), msg: msg.into() }
    }
    /// Shorthand for a [`FakError::Shard`].
    pub fn shard(tensor: impl Into<String>, format: impl Into<String>, n_shards: usize, msg: impl Into<String>) -> Self {
        FakError::Shard { tensor: tensor.into(), format: format.into(), n_shards, msg: msg.into() }
    }
    /// Shorthand for a [`FakError::ContextLength`] of a prompt (with `max_tokens` when the prompt
    /// alone fits) in a window of `n_ctx` tokens.
    pub fn context_length(n_prompt: usize, max_tokens: Option<usize>, n_ctx: usize) -> Self {
        let param = if max_tokens.is_some() { "max_tokens" } else { "prompt_ids" };
        FakError::ContextLength { param: param.into(), n_prompt, max_tokens, n_ctx }
    }
    /// The tokens a [`FakError::ContextLength`] asked the window to hold (prompt plus
    /// `max_tokens`); `None` for another variant.
    pub fn n_tokens(&self) -> Option<usize> {
        match self {
            FakError::ContextLength { n_prompt, max_tokens, .. } => Some(n_prompt + max_tokens.unwrap_or(0)),
            _ => None,
        }
    }
    /// Shorthand for a [`FakError::Model`].
    pub fn model(msg: impl Into<String>) -> Self {
        FakError::Model(msg.into())
    }
}

fn context_length_message(param: &str, n_prompt: usize, max_tokens: Option<usize>, n_ctx: usize) -> String {
    match (param, max_tokens) {
        (_, Some(m)) => format!(
            "the prompt has {n_prompt} tokens and max_tokens asks for {m} more: {} tokens, but the context holds \
             {n_ctx}; shorten the prompt, lower max_tokens or raise n_ctx",
            n_prompt + m
        ),
        ("token_ids", None) => {
            format!("{n_prompt} token ids but the context holds {n_ctx} tokens; pass fewer or raise n_ctx")
        }
        _ => format!(
            "the prompt has {n_prompt} tokens but the context holds {n_ctx} tokens (one must be left to generate); \
             shorten the prompt or raise n_ctx"
        ),
    }
}

/// Result alias used across the crate.
pub type Result<T, E = FakError> = std::result::Result<T, E>;
