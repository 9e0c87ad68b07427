//! fak's Rust core: GGUF reading, quantized block formats, the model forward pass on pluggable
//! backends (CPU reference, CUDA), and the engine (sequences, KV cache, sampling).
//!
//! Everything here is plain Rust that `cargo test` builds without Python; the PyO3 boundary is the
//! `python` module, compiled only with the `python` feature (maturin turns it on).

pub mod backend;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod model;
pub mod parallel;
pub mod quant;

#[cfg(feature = "python")]
mod python;

pub use error::{FakError, Result};
