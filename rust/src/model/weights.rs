//! Tensor names → weights, with shape checks, under llama.cpp's GGUF tensor names
//! (`llama-arch.cpp` `LLM_TENSOR_NAMES`: `token_embd`, `blk.{i}.attn_q`, `output_norm`, ...).
//!
//! The output projection is `output.weight`, or the token embedding itself when the file has no
//! `output.weight` (tied embeddings, as llama.cpp falls back to `token_embd` with
//! `TENSOR_DUPLICATED`).

use std::any::Any;
use std::sync::Arc;

use super::config::ModelConfig;
use crate::backend::{Backend, HostTensor};
use crate::gguf::GgufFile;
use crate::{FakError, Result};

/// The weights of one transformer block.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Weight,
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    pub wo: B::Weight,
    pub bo: Option<B::Weight>,
    pub ffn_norm: B::Weight,
    pub w_gate: B::Weight,
    pub w_up: B::Weight,
    pub w_down: B::Weight,
}

/// All weights of a model.
pub struct Weights<B: Backend> {
    pub token_embd: B::Weight,
    pub layers: Vec<LayerWeights<B>>,
    pub output_norm: B::Weight,
    /// `None`: tied to `token_embd`.
    pub output: Option<B::Weight>,
    /// llama3-style RoPE frequency factors (`rope_freqs.weight`, `[n_rot/2]`).
    pub rope_freqs: Option<B::Weight>,
}

impl<B: Backend> Weights<B> {
    /// The LM head (`output.weight` or the tied embedding).
    pub fn lm_head(&self) -> &B::Weight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

struct Loader<'a, B: Backend> {
    file: &'a Arc<GgufFile>,
    backend: &'a B,
}

impl<B: Backend> Loader<'_, B> {
    fn optional(&self, name: &str, shape: &[usize]) -> Result<Option<B::Weight>> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        let dims: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
        if dims != shape {
            return Err(FakError::model(format!(
                "tensor {name} has shape {dims:?} (ggml order), expected {shape:?}"
            )));
        }
        let owner: Arc<dyn Any + Send + Sync> = self.file.clone();
        let t = HostTensor {
            name,
            wtype: info.ggml_type,
            dims: &dims,
            data: self.file.tensor_data(info),
            owner,
        };
        self.backend.load_weight(&t).map(Some)
    }

    fn required(&self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        self.optional(name, shape)?
            .ok_or_else(|| FakError::model(format!("missing tensor {name}")))
    }
}

impl<B: Backend> Weights<B> {
    /// Loads every weight of `cfg` from `file` onto `backend`.
    ///
    /// Errors: [`FakError::Model`] naming a missing tensor or one with the wrong shape;
    /// [`FakError::Unsupported`] for a mixture-of-experts file or a block format the backend's
    /// matmul does not run.
    pub fn load(file: &Arc<GgufFile>, cfg: &ModelConfig, backend: &B) -> Result<Weights<B>> {
        let l = Loader { file, backend };
        let (d, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        if file.tensor("blk.0.ffn_gate_exps.weight").is_some() {
            return Err(FakError::Unsupported(
                "mixture-of-experts layers (blk.*.ffn_gate_exps)".into(),
            ));
        }
        let token_embd = l.required("token_embd.weight", &[d, cfg.n_vocab])?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let bias = |s: &str, len: usize| -> Result<Option<B::Weight>> {
                if cfg.arch.requires_qkv_bias() {
                    l.required(&n(s), &[len]).map(Some)
                } else {
                    l.optional(&n(s), &[len])
                }
            };
            layers.push(LayerWeights {
                attn_norm: l.required(&n("attn_norm.weight"), &[d])?,
                wq: l.required(&n("attn_q.weight"), &[d, q])?,
                wk: l.required(&n("attn_k.weight"), &[d, kv])?,
                wv: l.required(&n("attn_v.weight"), &[d, kv])?,
                bq: bias("attn_q.bias", q)?,
                bk: bias("attn_k.bias", kv)?,
                bv: bias("attn_v.bias", kv)?,
                wo: l.required(&n("attn_output.weight"), &[q, d])?,
                bo: l.optional(&n("attn_output.bias"), &[d])?,
                ffn_norm: l.required(&n("ffn_norm.weight"), &[d])?,
                w_gate: l.required(&n("ffn_gate.weight"), &[d, ff])?,
                w_up: l.required(&n("ffn_up.weight"), &[d, ff])?,
                w_down: l.required(&n("ffn_down.weight"), &[ff, d])?,
            });
        }
        Ok(Weights {
            token_embd,
            layers,
            output_norm: l.required("output_norm.weight", &[d])?,
            output: l.optional("output.weight", &[d, cfg.n_vocab])?,
            rope_freqs: match &cfg.rope_scaling.freq_factors {
                Some(ff) => Some(host_f32(backend, "rope_freqs.weight (computed)", ff)?),
                None => l.optional("rope_freqs.weight", &[cfg.rope.n_rot / 2])?,
            },
        })
    }
}

/// Loads an f32 vector computed on the host (llama3 frequency factors) as a weight.
fn host_f32<B: Backend>(backend: &B, name: &str, v: &[f32]) -> Result<B::Weight> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let owner: Arc<Vec<u8>> = Arc::new(bytes);
    let dims = [v.len()];
    let t = HostTensor {
        name,
        wtype: crate::quant::GgmlType::F32,
        dims: &dims,
        data: owner.as_slice(),
        owner: owner.clone() as Arc<dyn Any + Send + Sync>,
    };
    backend.load_weight(&t)
}
