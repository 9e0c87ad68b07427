//! Model architectures: hyper-parameters from GGUF metadata ([`config`]), tensor names → weights
//! ([`weights`]), and the forward pass over any [`Backend`] ([`forward`]).

pub mod config;
pub mod forward;
pub mod rope_scaling;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

pub use config::{Arch, ModelConfig};
pub use forward::{Scratch, TensorParallel};
pub use rope_scaling::{RopeOverride, RopeScaling, RopeScalingKind};
pub use weights::Weights;

use crate::backend::Backend;
use crate::gguf::GgufFile;
use crate::Result;

/// A loaded model: hyper-parameters, weights on `backend`, and the file they come from.
pub struct Model<B: Backend> {
    pub config: ModelConfig,
    pub backend: B,
    pub weights: Weights<B>,
    /// The mapped GGUF file (metadata stays available; CPU weights borrow its pages).
    pub file: Arc<GgufFile>,
}

impl<B: Backend> Model<B> {
    /// Opens the GGUF file at `path` and loads it onto `backend`.
    ///
    /// Errors: [`crate::FakError::Io`] / [`crate::FakError::Gguf`] for the file,
    /// [`crate::FakError::Unsupported`] for an architecture or format fak does not run,
    /// [`crate::FakError::Model`] naming a missing or mis-shaped tensor or hyper-parameter.
    pub fn open(path: impl AsRef<Path>, backend: B) -> Result<Model<B>> {
        Self::open_with(path, backend, &RopeOverride::default())
    }

    /// [`Self::open`] with RoPE scaling settings over the file's ([`rope_scaling::resolve`]).
    pub fn open_with(path: impl AsRef<Path>, backend: B, rope: &RopeOverride) -> Result<Model<B>> {
        Self::from_file_with(Arc::new(GgufFile::open(path)?), backend, rope)
    }

    /// [`Self::open_with`] with the MoE experts of the first `n_cpu_moe` layers kept in host
    /// memory ([`Backend::load_weight_host`]; llama.cpp's `--n-cpu-moe`, `usize::MAX` for
    /// `--cpu-moe`).
    pub fn open_placed(path: impl AsRef<Path>, backend: B, rope: &RopeOverride, n_cpu_moe: usize) -> Result<Model<B>> {
        let file = Arc::new(GgufFile::open(path)?);
        let config = ModelConfig::from_gguf_with(&file, rope)?;
        let weights = Weights::load_placed(&file, &config, &backend, n_cpu_moe)?;
        Ok(Model { config, backend, weights, file })
    }

    /// Loads an already opened file onto `backend`.
    pub fn from_file(file: Arc<GgufFile>, backend: B) -> Result<Model<B>> {
        Self::from_file_with(file, backend, &RopeOverride::default())
    }

    /// [`Self::from_file`] with RoPE scaling settings over the file's.
    pub fn from_file_with(file: Arc<GgufFile>, backend: B, rope: &RopeOverride) -> Result<Model<B>> {
        let config = ModelConfig::from_gguf_with(&file, rope)?;
        let weights = Weights::load(&file, &config, &backend)?;
        Ok(Model {
            config,
            backend,
            weights,
            file,
        })
    }
}
