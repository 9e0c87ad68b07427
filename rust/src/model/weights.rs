//! Tensor names → weights, with shape checks, under llama.cpp's GGUF tensor names
//! (`llama-arch.cpp` `LLM_TENSOR_NAMES`: `token_embd`, `blk.{i}.attn_q`, `output_norm`, ...).
//!
//! The output projection is `output.weight`, or the token embedding itself when the file has no
//! `output.weight` (tied embeddings, as llama.cpp falls back to `token_embd` with
//! `TENSOR_DUPLICATED`).
//!
//! [`Weights::load_shard`] loads one tensor-parallel shard's part of every tensor
//! (`crate::parallel::plan` says which; `crate::parallel::slice` cuts it, in its blocks).

use std::any::Any;
use std::sync::Arc;

use super::config::ModelConfig;
use crate::backend::{Backend, HostTensor};
use crate::gguf::GgufFile;
use crate::parallel::slice::{self, Cut, Sliced};
use crate::parallel::ShardSpec;
use crate::{FakError, Result};

/// A MoE layer's shared expert (Qwen3.5-MoE): a SwiGLU MLP of `n_ff_shexp` on every row, its
/// output times `sigmoid(h·gate_inp)` (`ffn_gate_inp_shexp`, `[n_embd]`).
pub struct SharedExpert<B: Backend> {
    pub gate_inp: B::Weight,
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

/// The FFN of one block: a dense SwiGLU MLP, or a mixture of experts.
pub enum Ffn<B: Backend> {
    /// `(silu(h·Wgate) ⊙ h·Wup)·Wdown`.
    Dense { w_gate: B::Weight, w_up: B::Weight, w_down: B::Weight },
    /// `ffn_gate_inp` `[n_embd, n_expert]` (the router), and every expert's SwiGLU MLP stacked
    /// along the last axis: `ffn_gate_exps` / `ffn_up_exps` `[n_embd, n_ff_exp, n_expert]`,
    /// `ffn_down_exps` `[n_ff_exp, n_embd, n_expert]` (ggml order).
    Moe { gate_inp: B::Weight, gate_exps: B::Weight, up_exps: B::Weight, down_exps: B::Weight, shared: Option<SharedExpert<B>> },
}

/// The attention of one block.
pub struct AttnWeights<B: Backend> {
    /// `[n_embd, n_head·head_dim]`, or for gated attention (qwen35) `[n_embd, 2·n_head·head_dim]`:
    /// each head's query then its output gate.
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    pub wo: B::Weight,
    pub bo: Option<B::Weight>,
    /// Per-head RMSNorm weights of Q and K (`[head_dim]`, Qwen3), applied before RoPE.
    pub q_norm: Option<B::Weight>,
    pub k_norm: Option<B::Weight>,
    /// The attention output is multiplied by `sigmoid(gate)` before `Wo` (qwen35).
    pub gated: bool,
}

/// The Gated DeltaNet of one block of a hybrid model (see `crate::backend::DeltaNetWeights`).
pub struct DeltaNetLayer<B: Backend> {
    pub qkv: B::Weight,
    pub gate: B::Weight,
    pub beta: B::Weight,
    pub alpha: B::Weight,
    pub conv: B::Weight,
    pub dt_bias: B::Weight,
    pub a: B::Weight,
    pub norm: B::Weight,
    pub out: B::Weight,
    /// Which of the cache's recurrent state layers is this layer's.
    pub state_layer: usize,
}

/// What mixes the tokens in a block: attention over the KV cache, or a Gated DeltaNet over a
/// recurrent state.
pub enum Mixer<B: Backend> {
    Attention(AttnWeights<B>),
    DeltaNet(DeltaNetLayer<B>),
}

/// The weights of one transformer block.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Weight,
    pub mixer: Mixer<B>,
    /// The norm before the FFN (`ffn_norm`, or qwen35's `post_attention_norm`).
    pub ffn_norm: B::Weight,
    pub ffn: Ffn<B>,
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
    /// Layers whose MoE experts are in host memory ([`Backend::load_weight_host`]): their
    /// forward cannot be one captured graph.
    pub host_expert_layers: usize,
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
    /// Shards of the plan (for errors); 1 for a whole model.
    n_shards: usize,
}

impl<B: Backend> Loader<'_, B> {
    /// Tensor `name`, which must have `shape` (the whole model's, ggml order), cut to `cut`.
    fn optional(&self, name: &str, shape: &[usize], cut: Cut) -> Result<Option<B::Weight>> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        let dims: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
        if dims != shape {
            return Err(FakError::model(format!(
                "tensor {name} has shape {dims:?} (ggml order), expected {shape:?}"
            )));
        }
        let (dims, data) = slice::cut(name, info.ggml_type, &dims, self.file.tensor_data(info), &cut, self.n_shards)?;
        let (data, owner): (&[u8], Arc<dyn Any + Send + Sync>) = match data {
            Sliced::Borrowed(b) => (b, self.file.clone()),
            Sliced::Owned(v) => return self.load_owned(name, info.ggml_type, &dims, Arc::new(v)).map(Some),
        };
        let t = HostTensor {
            name,
            wtype: info.ggml_type,
            dims: &dims,
            data,
            owner,
        };
        self.backend.load_weight(&t).map(Some)
    }

    /// Loads blocks gathered into `v` (a row split), kept alive by the weight through `owner`.
    fn load_owned(&self, name: &str, wtype: crate::quant::GgmlType, dims: &[usize], v: Arc<Vec<u8>>) -> Result<B::Weight> {
        let t = HostTensor {
            name,
            wtype,
            dims,
            data: v.as_slice(),
            owner: v.clone() as Arc<dyn Any + Send + Sync>,
        };
        self.backend.load_weight(&t)
    }

    /// Tensor `name` (whole, of `shape`) kept in host memory ([`Backend::load_weight_host`]).
    fn required_host(&self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        let info = self.file.tensor(name).ok_or_else(|| FakError::model(format!("missing tensor {name}")))?;
        let dims: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
        if dims != shape {
            return Err(FakError::model(format!("tensor {name} has shape {dims:?} (ggml order), expected {shape:?}")));
        }
        let t = HostTensor { name, wtype: info.ggml_type, dims: &dims, data: self.file.tensor_data(info), owner: self.file.clone() };
        self.backend.load_weight_host(&t)
    }

    fn required(&self, name: &str, shape: &[usize], cut: Cut) -> Result<B::Weight> {
        self.optional(name, shape, cut)?
            .ok_or_else(|| FakError::model(format!("missing tensor {name}")))
    }
}

impl<B: Backend> Weights<B> {
    /// Loads every weight of `cfg` from `file` onto `backend`.
    ///
    /// Errors: [`FakError::Model`] naming a missing tensor or one with the wrong shape;
    /// [`FakError::Unsupported`] for mixture-of-experts tensors in a dense architecture's file or
    /// a block format the backend's matmul does not run.
    pub fn load(file: &Arc<GgufFile>, cfg: &ModelConfig, backend: &B) -> Result<Weights<B>> {
        Self::load_shard(file, cfg, backend, None, 1)
    }

    /// [`Self::load`] with the experts of the first `n_cpu_moe` MoE layers in host memory.
    pub fn load_placed(file: &Arc<GgufFile>, cfg: &ModelConfig, backend: &B, n_cpu_moe: usize) -> Result<Weights<B>> {
        Self::load_impl(file, cfg, backend, None, 1, n_cpu_moe)
    }

    /// Loads the part of every weight of `cfg` (the whole model's config) that tensor-parallel
    /// shard `shard` of an `n_shards`-way plan holds (`None`: everything): Q/K/V rows of its query
    /// and KV heads and their biases, the K range of its query heads in `attn_output` (its bias on
    /// rank 0 only), its FFN columns (rows of gate/up, K of down), of a MoE layer its experts
    /// whole or its columns of every expert (the router replicated), its vocabulary rows of the
    /// LM head (of `token_embd` when tied), and the replicated embedding and norms (Qwen3's
    /// per-head Q/K norms too: every head has the same `[head_dim]` weight). Row splits and whole
    /// experts borrow the file's blocks; K splits and the columns of every expert copy the blocks
    /// they keep (still quantized).
    ///
    /// Errors: as [`Self::load`]; [`FakError::Shard`] when a K range does not fall on the blocks
    /// of a tensor's format.
    pub fn load_shard(file: &Arc<GgufFile>, cfg: &ModelConfig, backend: &B, shard: Option<&ShardSpec>, n_shards: usize) -> Result<Weights<B>> {
        Self::load_impl(file, cfg, backend, shard, n_shards, 0)
    }

    fn load_impl(file: &Arc<GgufFile>, cfg: &ModelConfig, backend: &B, shard: Option<&ShardSpec>, n_shards: usize, n_cpu_moe: usize) -> Result<Weights<B>> {
        let l = Loader { file, backend, n_shards };
        let (d, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        if file.tensor("blk.0.ffn_gate_exps.weight").is_some() && cfg.moe.is_none() {
            return Err(FakError::Unsupported(format!(
                "mixture-of-experts layers (blk.*.ffn_gate_exps) in a {} file",
                cfg.arch.name()
            )));
        }
        if n_cpu_moe > 0 && shard.is_some() {
            return Err(FakError::Unsupported("experts in host memory (--cpu-moe / --n-cpu-moe) with tensor parallelism".into()));
        }
        let hd = cfg.head_dim;
        // (column split, row split) cuts of the attention, the FFN and the vocabulary.
        let rows = |r: Option<std::ops::Range<usize>>| r.map_or(Cut::Whole, Cut::Rows);
        let cols = |r: Option<std::ops::Range<usize>>| r.map_or(Cut::Whole, Cut::Cols);
        let q_cols = shard.map(|s| s.q_cols(hd));
        let kv_cols = shard.map(|s| s.kv_cols(hd));
        let ffn = shard.map(|s| s.ffn.clone());
        // A MoE shard's experts, whole (borrowed); or its columns of every expert: rows of each
        // gate/up matrix, K of each down's (copied).
        let experts = shard.and_then(|s| s.experts.clone());
        let (gate_up_cut, down_cut) = match (&experts, &ffn) {
            (Some(e), _) => (Cut::Stack(e.clone()), Cut::Stack(e.clone())),
            (None, Some(f)) => (Cut::StackRows(f.clone()), Cut::Cols(f.clone())),
            (None, None) => (Cut::Whole, Cut::Whole),
        };
        if cfg.hybrid.is_some() && shard.is_some() {
            return Err(FakError::Unsupported("tensor parallelism of a hybrid (Gated DeltaNet) model".into()));
        }
        let row_bias = shard.is_none_or(ShardSpec::adds_row_bias);
        let token_embd = l.required("token_embd.weight", &[d, cfg.n_vocab], Cut::Whole)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let qk_norm = |name: &str| -> Result<Option<B::Weight>> {
                if cfg.arch.has_qk_norm() {
                    l.required(name, &[hd], Cut::Whole).map(Some)
                } else {
                    Ok(None)
                }
            };
            let bias = |s: &str, len: usize, cut: Cut| -> Result<Option<B::Weight>> {
                if cfg.arch.requires_qkv_bias() {
                    l.required(&n(s), &[len], cut).map(Some)
                } else {
                    l.optional(&n(s), &[len], cut)
                }
            };
            let recurrent = cfg.hybrid.as_ref().is_some_and(|h| h.recurrent[i]);
            let mixer = if recurrent {
                let hy = cfg.hybrid.as_ref().expect("recurrent implies hybrid");
                let (cd, vd, nv) = (hy.conv_dim(), hy.value_dim(), hy.n_v_heads);
                let state_layer = hy.recurrent[..i].iter().filter(|&&r| r).count();
                Mixer::DeltaNet(DeltaNetLayer {
                    qkv: l.required(&n("attn_qkv.weight"), &[d, cd], Cut::Whole)?,
                    gate: l.required(&n("attn_gate.weight"), &[d, vd], Cut::Whole)?,
                    beta: l.required(&n("ssm_beta.weight"), &[d, nv], Cut::Whole)?,
                    alpha: l.required(&n("ssm_alpha.weight"), &[d, nv], Cut::Whole)?,
                    conv: l.required(&n("ssm_conv1d.weight"), &[hy.d_conv, cd], Cut::Whole)?,
                    dt_bias: l.required(&n("ssm_dt.bias"), &[nv], Cut::Whole)?,
                    a: l.required(&n("ssm_a"), &[nv], Cut::Whole)?,
                    norm: l.required(&n("ssm_norm.weight"), &[hy.d_state], Cut::Whole)?,
                    out: l.required(&n("ssm_out.weight"), &[vd, d], Cut::Whole)?,
                    state_layer,
                })
            } else {
                let gated = cfg.arch.is_hybrid();
                let qw = if gated { 2 * q } else { q };
                Mixer::Attention(AttnWeights {
                    wq: l.required(&n("attn_q.weight"), &[d, qw], rows(q_cols.clone()))?,
                    wk: l.required(&n("attn_k.weight"), &[d, kv], rows(kv_cols.clone()))?,
                    wv: l.required(&n("attn_v.weight"), &[d, kv], rows(kv_cols.clone()))?,
                    bq: bias("attn_q.bias", qw, rows(q_cols.clone()))?,
                    bk: bias("attn_k.bias", kv, rows(kv_cols.clone()))?,
                    bv: bias("attn_v.bias", kv, rows(kv_cols.clone()))?,
                    wo: l.required(&n("attn_output.weight"), &[q, d], cols(q_cols.clone()))?,
                    bo: if row_bias { l.optional(&n("attn_output.bias"), &[d], Cut::Whole)? } else { None },
                    q_norm: qk_norm(&n("attn_q_norm.weight"))?,
                    k_norm: qk_norm(&n("attn_k_norm.weight"))?,
                    gated,
                })
            };
            let ffn_norm_name = if cfg.arch.is_hybrid() { "post_attention_norm.weight" } else { "ffn_norm.weight" };
            layers.push(LayerWeights {
                attn_norm: l.required(&n("attn_norm.weight"), &[d], Cut::Whole)?,
                mixer,
                ffn_norm: l.required(&n(ffn_norm_name), &[d], Cut::Whole)?,
                ffn: match &cfg.moe {
                    None => Ffn::Dense {
                        w_gate: l.required(&n("ffn_gate.weight"), &[d, ff], rows(ffn.clone()))?,
                        w_up: l.required(&n("ffn_up.weight"), &[d, ff], rows(ffn.clone()))?,
                        w_down: l.required(&n("ffn_down.weight"), &[ff, d], cols(ffn.clone()))?,
                    },
                    Some(m) => {
                        let (ne, fe) = (m.n_expert, m.n_ff_exp);
                        let host = i < n_cpu_moe;
                        let exps = |s: &str, shape: &[usize], cut: Cut| if host { l.required_host(&n(s), shape) } else { l.required(&n(s), shape, cut) };
                        let shared = if m.n_ff_shexp > 0 && l.file.tensor(&n("ffn_up_shexp.weight")).is_some() {
                            if shard.is_some() {
                                return Err(FakError::Unsupported("tensor parallelism of a MoE layer with a shared expert".into()));
                            }
                            let fs = m.n_ff_shexp;
                            Some(SharedExpert {
                                gate_inp: l.required(&n("ffn_gate_inp_shexp.weight"), &[d], Cut::Whole)?,
                                gate: l.required(&n("ffn_gate_shexp.weight"), &[d, fs], Cut::Whole)?,
                                up: l.required(&n("ffn_up_shexp.weight"), &[d, fs], Cut::Whole)?,
                                down: l.required(&n("ffn_down_shexp.weight"), &[fs, d], Cut::Whole)?,
                            })
                        } else {
                            None
                        };
                        Ffn::Moe {
                            gate_inp: l.required(&n("ffn_gate_inp.weight"), &[d, ne], Cut::Whole)?,
                            gate_exps: exps("ffn_gate_exps.weight", &[d, fe, ne], gate_up_cut.clone())?,
                            up_exps: exps("ffn_up_exps.weight", &[d, fe, ne], gate_up_cut.clone())?,
                            down_exps: exps("ffn_down_exps.weight", &[fe, d, ne], down_cut.clone())?,
                            shared,
                        }
                    }
                },
            });
        }
        // The LM head: a shard holds its vocabulary rows, of `token_embd` when the file ties them.
        let output = match shard {
            None => l.optional("output.weight", &[d, cfg.n_vocab], Cut::Whole)?,
            Some(s) => Some(match l.optional("output.weight", &[d, cfg.n_vocab], Cut::Rows(s.vocab.clone()))? {
                Some(w) => w,
                None => l.required("token_embd.weight", &[d, cfg.n_vocab], Cut::Rows(s.vocab.clone()))?,
            }),
        };
        let host_expert_layers = if cfg.moe.is_some() { n_cpu_moe.min(cfg.n_layer) } else { 0 };
        Ok(Weights {
            host_expert_layers,
            token_embd,
            layers,
            output_norm: l.required("output_norm.weight", &[d], Cut::Whole)?,
            output,
            rope_freqs: match &cfg.rope_scaling.freq_factors {
                Some(ff) => Some(host_f32(backend, "rope_freqs.weight (computed)", ff)?),
                None => l.optional("rope_freqs.weight", &[cfg.rope.n_rot / 2], Cut::Whole)?,
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
