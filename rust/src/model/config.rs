//! Hyper-parameters of a decoder-only transformer, read from GGUF metadata under llama.cpp's key
//! names (`llama-arch.cpp` `LLM_KV_*`: `{arch}.block_count`, `{arch}.attention.head_count`, ...).
//!
//! Supported architectures: `qwen2` (Qwen2 / Qwen2.5 / Qwen2.5-Coder: Q/K/V biases, NEOX RoPE)
//! and `llama` (Llama 2/3.x, SmolLM2, Mistral-style dense models: no biases, NORM RoPE).

use super::rope_scaling::{self, RopeMeta, RopeOverride, RopeScaling};
use crate::backend::{AttnParams, RopeParams, RopeStyle};
use crate::gguf::{GgufFile, MetaValue};
use crate::{FakError, Result};

/// A supported architecture (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Qwen2,
    Llama,
}

impl Arch {
    /// The architecture named `name`, or [`FakError::Unsupported`] naming it.
    pub fn from_name(name: &str) -> Result<Arch> {
        match name {
            "qwen2" => Ok(Arch::Qwen2),
            "llama" => Ok(Arch::Llama),
            other => Err(FakError::Unsupported(format!(
                "model architecture {other:?} (general.architecture); fak runs \"qwen2\" and \"llama\""
            ))),
        }
    }

    /// The GGUF spelling (`"qwen2"`, `"llama"`), also the metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Llama => "llama",
        }
    }

    /// The RoPE pairing llama.cpp uses for this architecture (`llama_model_rope_type`).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Qwen2 => RopeStyle::Neox,
            Arch::Llama => RopeStyle::Norm,
        }
    }

    /// Whether Q/K/V projections carry biases that must be present.
    pub fn requires_qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2)
    }
}

/// The hyper-parameters the forward pass needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    /// Transformer blocks (`{arch}.block_count`).
    pub n_layer: usize,
    /// Hidden size (`{arch}.embedding_length`).
    pub n_embd: usize,
    /// MLP inner size (`{arch}.feed_forward_length`).
    pub n_ff: usize,
    /// Query heads (`{arch}.attention.head_count`).
    pub n_head: usize,
    /// KV heads (`{arch}.attention.head_count_kv`, default `n_head`).
    pub n_head_kv: usize,
    /// Per-head size (`{arch}.attention.key_length`, default `n_embd / n_head`).
    pub head_dim: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub n_vocab: usize,
    /// Context length the model was trained for (`{arch}.context_length`).
    pub n_ctx_train: usize,
    /// RMSNorm epsilon (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// RoPE (`{arch}.rope.*`, scaling resolved: see [`rope_scaling`]).
    pub rope: RopeParams,
    /// The RoPE scaling scheme `rope` came from.
    pub rope_scaling: RopeScaling,
}

fn get<'a>(f: &'a GgufFile, key: &str) -> Option<&'a MetaValue> {
    f.get(key)
}

fn get_usize(f: &GgufFile, key: &str) -> Result<Option<usize>> {
    match get(f, key) {
        None => Ok(None),
        Some(v) => match v.as_integer() {
            Some(i) if i >= 0 && i <= usize::MAX as i128 => Ok(Some(i as usize)),
            Some(i) => Err(FakError::model(format!(
                "metadata {key} = {i} is out of range"
            ))),
            None if v.as_array().is_some() => Err(FakError::Unsupported(format!(
                "metadata {key} is a per-layer array ({}); fak needs one value for all layers",
                v.type_name()
            ))),
            None => Err(FakError::model(format!(
                "metadata {key} must be an integer, found {}",
                v.type_name()
            ))),
        },
    }
}

fn req_usize(f: &GgufFile, key: &str) -> Result<usize> {
    get_usize(f, key)?.ok_or_else(|| FakError::model(format!("missing metadata key {key}")))
}

fn get_f32(f: &GgufFile, key: &str) -> Result<Option<f32>> {
    match get(f, key) {
        None => Ok(None),
        Some(v) => match v.as_float().or_else(|| v.as_integer().map(|i| i as f64)) {
            Some(x) => Ok(Some(x as f32)),
            None => Err(FakError::model(format!(
                "metadata {key} must be a number, found {}",
                v.type_name()
            ))),
        },
    }
}

impl ModelConfig {
    /// Reads the hyper-parameters of `f`. `n_vocab` comes from `token_embd.weight`.
    ///
    /// Errors: [`FakError::Unsupported`] for another architecture, per-layer head counts or
    /// LongRoPE scaling; [`FakError::Model`] for a missing or inconsistent value.
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig> {
        Self::from_gguf_with(f, &RopeOverride::default())
    }

    /// [`Self::from_gguf`] with the caller's RoPE scaling settings over the file's
    /// ([`rope_scaling::resolve`]).
    pub fn from_gguf_with(f: &GgufFile, rope_override: &RopeOverride) -> Result<ModelConfig> {
        let arch_name = get(f, "general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| FakError::model("missing metadata key general.architecture"))?;
        let arch = Arch::from_name(arch_name)?;
        let a = arch.name();
        let k = |s: &str| format!("{a}.{s}");

        let n_layer = req_usize(f, &k("block_count"))?;
        let n_embd = req_usize(f, &k("embedding_length"))?;
        let n_ff = req_usize(f, &k("feed_forward_length"))?;
        let n_head = req_usize(f, &k("attention.head_count"))?;
        let n_head_kv = get_usize(f, &k("attention.head_count_kv"))?.unwrap_or(n_head);
        if n_layer == 0 || n_embd == 0 || n_ff == 0 || n_head == 0 || n_head_kv == 0 {
            return Err(FakError::model(format!(
                "zero-sized hyper-parameter: block_count {n_layer}, embedding_length {n_embd}, feed_forward_length {n_ff}, head_count {n_head}, head_count_kv {n_head_kv}"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(FakError::model(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let head_dim = match get_usize(f, &k("attention.key_length"))? {
            Some(d) => d,
            None => {
                if n_embd % n_head != 0 {
                    return Err(FakError::model(format!(
                        "embedding_length {n_embd} is not a multiple of head_count {n_head}"
                    )));
                }
                n_embd / n_head
            }
        };
        if let Some(vd) = get_usize(f, &k("attention.value_length"))? {
            if vd != head_dim {
                return Err(FakError::Unsupported(format!(
                    "attention.value_length {vd} different from key_length {head_dim}"
                )));
            }
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(FakError::model(format!(
                "head dimension {head_dim} must be even and positive"
            )));
        }
        let n_ctx_train = get_usize(f, &k("context_length"))?.unwrap_or(0);
        let rms_eps = get_f32(f, &k("attention.layer_norm_rms_epsilon"))?.ok_or_else(|| {
            FakError::model(format!(
                "missing metadata key {}",
                k("attention.layer_norm_rms_epsilon")
            ))
        })?;
        let freq_base = get_f32(f, &k("rope.freq_base"))?.unwrap_or(10000.0);
        let n_rot = get_usize(f, &k("rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 || n_rot == 0 {
            return Err(FakError::model(format!("rope.dimension_count {n_rot} must be even and at most the head dimension {head_dim}")));
        }
        let str_key = |key: &str| get(f, key).and_then(|v| v.as_str()).map(str::to_string);
        let meta = RopeMeta {
            kind: str_key(&k("rope.scaling.type")),
            factor: get_f32(f, &k("rope.scaling.factor"))?.or(get_f32(f, &k("rope.scale_linear"))?),
            orig_ctx: get_usize(f, &k("rope.scaling.original_context_length"))?,
            attn_factor: get_f32(f, &k("rope.scaling.attn_factor"))?,
            ext_factor: get_f32(f, &k("rope.scaling.yarn_ext_factor"))?,
            beta_fast: get_f32(f, &k("rope.scaling.yarn_beta_fast"))?,
            beta_slow: get_f32(f, &k("rope.scaling.yarn_beta_slow"))?,
            yarn_log_mul: get_f32(f, &k("rope.scaling.yarn_log_multiplier"))?,
        };
        let (rope, rope_scaling) =
            rope_scaling::resolve(arch.rope_style(), n_rot, freq_base, n_ctx_train, &meta, rope_override)?;
        let token_embd = f
            .tensor("token_embd.weight")
            .ok_or_else(|| FakError::model("missing tensor token_embd.weight"))?;
        if token_embd.dims.len() != 2 || token_embd.dims[0] as usize != n_embd {
            return Err(FakError::model(format!(
                "tensor token_embd.weight has shape {:?}, expected [{n_embd}, n_vocab]",
                token_embd.dims
            )));
        }
        let n_vocab = token_embd.dims[1] as usize;
        Ok(ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rms_eps,
            rope,
            rope_scaling,
        })
    }

    /// The attention shape (`scale = 1/sqrt(head_dim)`).
    pub fn attn(&self) -> AttnParams {
        AttnParams {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }

    /// Width of the query projection (`n_head · head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the key/value projections (`n_head_kv · head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
