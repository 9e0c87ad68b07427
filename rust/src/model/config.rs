//! Hyper-parameters of a decoder-only transformer, read from GGUF metadata under llama.cpp's key
//! names (`llama-arch.cpp` `LLM_KV_*`: `{arch}.block_count`, `{arch}.attention.head_count`, ...).
//!
//! Supported architectures: `qwen2` (Qwen2 / Qwen2.5 / Qwen2.5-Coder: Q/K/V biases, NEOX RoPE),
//! `llama` (Llama 2/3.x, SmolLM2, Mistral-style dense models: no biases, NORM RoPE), `qwen3`
//! (Qwen3 dense: no biases, a per-head RMSNorm of Q and K before RoPE, NEOX RoPE; llama.cpp
//! `src/models/qwen3.cpp`) and `qwen3moe` (Qwen3-MoE / Qwen3-Coder-30B-A3B: `qwen3`'s attention and
//! a mixture-of-experts FFN in every layer, [`MoeConfig`]; llama.cpp `src/models/qwen3moe.cpp`).
//!
//! Sliding-window attention (docs/long-context.md, "Sliding-window attention"), under llama.cpp's
//! keys (`LLM_KV_ATTENTION_SLIDING_WINDOW`, `LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN`):
//! - `{arch}.attention.sliding_window` (integer `W`; absent or 0: no window) — how many keys
//!   (the query's own included) a windowed layer attends to;
//! - `{arch}.attention.sliding_window_pattern`, which layers are windowed: an array of one
//!   bool/integer per layer (true/non-zero: windowed; what llama.cpp's converter writes from Hugging
//!   Face's `layer_types`, `"sliding_attention"` → true), or one integer `n`, llama.cpp's
//!   `set_swa_pattern(n)`: layer `il` windowed iff `n == 0 || il % n < n − 1` (gemma2's 2,
//!   cohere2's 4, gemma3's 6: the last layer of each period has full attention), or one bool (all
//!   or none). Absent: every layer is windowed (Mistral 7B v0.1, Qwen2 with
//!   `max_window_layers = 0`).
//!
//! llama.cpp's own qwen2 and llama loaders ignore these keys (they read them for gemma2/3,
//! cohere2, gpt-oss, ...); fak honours them on every architecture it runs, and a file without them
//! runs exactly as before.

use super::rope_scaling::{self, RopeMeta, RopeOverride, RopeScaling};
use crate::backend::{AttnParams, RopeParams, RopeStyle};
use crate::gguf::{GgufFile, MetaValue};
use crate::{FakError, Result};

/// A supported architecture (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Qwen2,
    Llama,
    Qwen3,
    Qwen3Moe,
    Qwen35,
    Qwen35Moe,
}

impl Arch {
    /// The architecture named `name`, or [`FakError::Unsupported`] naming it.
    pub fn from_name(name: &str) -> Result<Arch> {
        match name {
            "qwen2" => Ok(Arch::Qwen2),
            "llama" => Ok(Arch::Llama),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            "qwen35" => Ok(Arch::Qwen35),
            "qwen35moe" => Ok(Arch::Qwen35Moe),
            other => Err(FakError::Unsupported(format!(
                "model architecture {other:?} (general.architecture); fak runs {}",
                Arch::SUPPORTED
            ))),
        }
    }

    /// The architectures fak runs, as an error message lists them.
    pub const SUPPORTED: &'static str = "\"qwen2\", \"llama\", \"qwen3\", \"qwen3moe\", and on the CPU \"qwen35\" and \"qwen35moe\"";

    /// The GGUF spelling (`"qwen2"`, `"llama"`, `"qwen3"`, `"qwen3moe"`), also the metadata key
    /// prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
        }
    }

    /// The RoPE pairing llama.cpp uses for this architecture (`llama_model_rope_type`).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            // qwen35: ggml_rope_multi (IMROPE sections); with the text positions of every section
            // equal it rotates as NEOX over the first `rope.dimension_count` dimensions.
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe => RopeStyle::Neox,
            Arch::Llama => RopeStyle::Norm,
        }
    }

    /// Whether Q/K/V projections carry biases that must be present.
    pub fn requires_qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2)
    }

    /// Whether each head of Q and K is RMS-normalized (`blk.N.attn_q_norm` / `attn_k_norm`,
    /// `[head_dim]`) between the projection and RoPE (Qwen3; llama.cpp `build_norm` on the
    /// `[head_dim, n_head, n_tokens]` view).
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe)
    }

    /// Whether layers mix Gated DeltaNet (linear attention with a recurrent state per sequence)
    /// and gated full attention ([`HybridConfig`]; Qwen3.5/3.6, llama.cpp `src/models/qwen35.cpp`).
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }

    /// Whether every layer's FFN is a mixture of experts ([`MoeConfig`]).
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Qwen35Moe)
    }
}

/// How a mixture-of-experts FFN picks and weighs its experts (llama.cpp `build_moe_ffn`):
/// `probs = softmax(x·W_gate_inp)` over `n_expert`, the `n_expert_used` largest chosen (ggml
/// `argsort_top_k`), their probabilities as weights, divided by their sum when `norm_w`
/// (clamped below at 2⁻¹⁴) and scaled by `w_scale` when it is neither 0 nor 1; each chosen
/// expert runs a SwiGLU FFN of `n_ff_exp` on the row, and the weighted outputs are summed in the
/// order of the choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    /// Experts per layer (`{arch}.expert_count`).
    pub n_expert: usize,
    /// Experts each token runs (`{arch}.expert_used_count`).
    pub n_expert_used: usize,
    /// The inner size of one expert (`{arch}.expert_feed_forward_length`, else
    /// `feed_forward_length / expert_used_count` as llama.cpp falls back).
    pub n_ff_exp: usize,
    /// Renormalize the chosen experts' weights to sum to 1 (`true` for qwen3moe, which llama.cpp
    /// hard-codes; `{arch}.expert_weights_norm` where the file has it).
    pub norm_w: bool,
    /// Multiplier of the weights (`{arch}.expert_weights_scale`; 0 or 1: none).
    pub w_scale: f32,
    /// Experts `[e0, e1)` whose matrices this model holds: all of them, `(0, n_expert)`, or a
    /// tensor-parallel shard's share when the experts are divided among the shards
    /// (`crate::parallel::plan::MoeSplit::Experts`; its `ffn_*_exps` then stack only those).
    pub held: (usize, usize),
    /// The shared expert's inner size (Qwen3.5-MoE: `{arch}.expert_shared_feed_forward_length`,
    /// else `feed_forward_length`), run on every token beside the routed ones and gated by
    /// `sigmoid(h·ffn_gate_inp_shexp)`; 0: no shared expert.
    pub n_ff_shexp: usize,
}

/// The Gated DeltaNet layers of a hybrid model (llama.cpp `qwen35`, `delta-net-base.cpp`): per
/// token `x·W_qkv` (`conv_dim = 2·n_k_heads·d_state + n_v_heads·d_state` channels) through a causal
/// depthwise convolution of `d_conv` taps and SiLU, split into q, k (`n_k_heads` heads of
/// `d_state`, L2-normalized) and v (`n_v_heads` heads of `d_state`); the recurrence per value head
/// `S ← e^g·S; δ = (v − Sᵀk)·β; S ← S + k·δᵀ; o = Sᵀq/√d_state` with `β = sigmoid(x·W_β)`,
/// `g = softplus(x·W_α + dt_bias)·a`; then `rmsnorm(o)·w_norm ⊙ silu(x·W_gate)` and `·W_out`.
/// Every `full_attention_interval`-th layer (or as `attention.recurrent_layers` says) is gated
/// full attention instead.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// Convolution taps (`{arch}.ssm.conv_kernel`).
    pub d_conv: usize,
    /// Head size of q, k and v (`{arch}.ssm.state_size`).
    pub d_state: usize,
    /// Query/key heads (`{arch}.ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`{arch}.ssm.time_step_rank`), a multiple of `n_k_heads`.
    pub n_v_heads: usize,
    /// Which layers are Gated DeltaNet (`[n_layer]`; the others gated full attention).
    pub recurrent: Vec<bool>,
}

impl HybridConfig {
    /// Width of v and of the layer's output before `W_out` (`n_v_heads · d_state`).
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_state
    }

    /// Channels of the convolution (q, k and v side by side).
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.d_state + self.value_dim()
    }

    /// f32 values of one sequence's recurrent state in one layer: the convolution's last
    /// `d_conv − 1` inputs and the `d_state × d_state` matrix of every value head.
    pub fn state_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim() + self.n_v_heads * self.d_state * self.d_state
    }
}

/// The most experts a layer may have or a token may use (llama.cpp `LLAMA_MAX_EXPERTS` is 512).
pub const MAX_EXPERTS: usize = 512;

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
    /// Sliding window in tokens of the windowed layers (`{arch}.attention.sliding_window`, or the
    /// caller's override); 0: no layer is windowed.
    pub sliding_window: usize,
    /// Which layers take the window when there is one (`{arch}.attention.sliding_window_pattern`;
    /// all of them when the file has no pattern), `[n_layer]`.
    pub swa_pattern: Vec<bool>,
    /// The mixture-of-experts FFN of every layer (`None`: a dense SwiGLU FFN of `n_ff`).
    pub moe: Option<MoeConfig>,
    /// The Gated DeltaNet layers of a hybrid model (`None`: every layer is attention).
    pub hybrid: Option<HybridConfig>,
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

/// The per-layer sliding-window pattern under `key` (see the module doc): `n_layer` flags, or
/// `None` when the file has no such key.
fn swa_pattern(f: &GgufFile, key: &str, n_layer: usize) -> Result<Option<Vec<bool>>> {
    let Some(v) = get(f, key) else {
        return Ok(None);
    };
    if let Some(b) = v.as_bool() {
        return Ok(Some(vec![b; n_layer]));
    }
    if let Some(n) = v.as_integer() {
        if n < 0 || n > u32::MAX as i128 {
            return Err(FakError::model(format!("metadata {key} = {n} is out of range")));
        }
        let n = n as usize;
        // llama.cpp `llama_hparams::set_swa_pattern(n_pattern)` (dense_first = false).
        return Ok(Some((0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()));
    }
    if let Some(a) = v.as_array() {
        if a.len() != n_layer {
            return Err(FakError::model(format!(
                "metadata {key} has {} entries for {n_layer} layers",
                a.len()
            )));
        }
        let mut out = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let e = a.get(i).expect("index below len");
            let on = e.as_bool().or_else(|| e.as_integer().map(|x| x != 0)).ok_or_else(|| {
                FakError::model(format!(
                    "metadata {key} must hold bools or integers, found {}",
                    v.type_name()
                ))
            })?;
            out.push(on);
        }
        return Ok(Some(out));
    }
    Err(FakError::model(format!(
        "metadata {key} must be an integer, a bool or an array of them, found {}",
        v.type_name()
    )))
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

/// The [`MoeConfig`] of a `qwen3moe`-style file (keys under `{arch}.`; `n_ff` its
/// `feed_forward_length` or 0).
fn moe_config(f: &GgufFile, a: &str, n_ff: usize) -> Result<MoeConfig> {
    let k = |s: &str| format!("{a}.{s}");
    let n_expert = req_usize(f, &k("expert_count"))?;
    let n_expert_used = req_usize(f, &k("expert_used_count"))?;
    if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert || n_expert > MAX_EXPERTS {
        return Err(FakError::model(format!(
            "expert_count {n_expert} / expert_used_count {n_expert_used}: need 1 <= used <= count <= {MAX_EXPERTS}"
        )));
    }
    let n_ff_exp = match get_usize(f, &k("expert_feed_forward_length"))? {
        Some(v) if v > 0 => v,
        _ if n_ff > 0 => n_ff / n_expert_used,
        _ => return Err(FakError::model(format!("missing metadata key {}", k("expert_feed_forward_length")))),
    };
    if n_ff_exp == 0 {
        return Err(FakError::model("zero-sized expert_feed_forward_length"));
    }
    let norm_w = match get(f, &k("expert_weights_norm")) {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| FakError::model(format!("metadata {} must be a bool", k("expert_weights_norm"))))?,
    };
    let w_scale = get_f32(f, &k("expert_weights_scale"))?.unwrap_or(0.0);
    let n_ff_shexp = if a == "qwen35moe" {
        get_usize(f, &k("expert_shared_feed_forward_length"))?.filter(|&v| v > 0).unwrap_or(n_ff)
    } else {
        0
    };
    Ok(MoeConfig { n_expert, n_expert_used, n_ff_exp, norm_w, w_scale, held: (0, n_expert), n_ff_shexp })
}

/// The [`HybridConfig`] of a `qwen35`-style file.
fn hybrid_config(f: &GgufFile, a: &str) -> Result<HybridConfig> {
    let k = |s: &str| format!("{a}.{s}");
    let n_layer = req_usize(f, &k("block_count"))?;
    let d_conv = req_usize(f, &k("ssm.conv_kernel"))?;
    let d_state = req_usize(f, &k("ssm.state_size"))?;
    let n_k_heads = req_usize(f, &k("ssm.group_count"))?;
    let n_v_heads = req_usize(f, &k("ssm.time_step_rank"))?;
    if d_conv < 2 || d_state == 0 || n_k_heads == 0 || n_v_heads == 0 || n_v_heads % n_k_heads != 0 {
        return Err(FakError::model(format!(
            "ssm.conv_kernel {d_conv}, state_size {d_state}, group_count {n_k_heads}, time_step_rank {n_v_heads}: need d_conv >= 2 and time_step_rank a multiple of group_count"
        )));
    }
    if let Some(inner) = get_usize(f, &k("ssm.inner_size"))? {
        if inner != n_v_heads * d_state {
            return Err(FakError::Unsupported(format!("ssm.inner_size {inner} != time_step_rank · state_size {}", n_v_heads * d_state)));
        }
    }
    // ggml_rope_multi with text positions: the first three sections rotate by the token's
    // position, the fourth by 0 (llama.cpp `llm_graph_input_pos`); with no pairs in the fourth
    // section that is plain NEOX RoPE, which is what fak runs.
    if let Some(sec) = get(f, &k("rope.dimension_sections")).and_then(|v| v.as_array()) {
        if sec.len() >= 4 && sec.get(3).and_then(|v| v.as_integer()).unwrap_or(0) != 0 {
            return Err(FakError::Unsupported(format!("{} with pairs in the fourth M-RoPE section", k("rope.dimension_sections"))));
        }
    }
    // llama.cpp: `attention.recurrent_layers` (per layer), else every `full_attention_interval`-th
    // layer (default 4) is full attention.
    let recurrent = match swa_pattern(f, &k("attention.recurrent_layers"), n_layer)? {
        Some(v) => v,
        None => {
            let every = get_usize(f, &k("full_attention_interval"))?.unwrap_or(4).max(1);
            (0..n_layer).map(|i| (i + 1) % every != 0).collect()
        }
    };
    Ok(HybridConfig { d_conv, d_state, n_k_heads, n_v_heads, recurrent })
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
        let n_ff = if arch.is_moe() {
            get_usize(f, &k("feed_forward_length"))?.unwrap_or(0)
        } else {
            req_usize(f, &k("feed_forward_length"))?
        };
        let moe = if arch.is_moe() { Some(moe_config(f, a, n_ff)?) } else { None };
        let hybrid = if arch.is_hybrid() { Some(hybrid_config(f, a)?) } else { None };
        // A MoE model has no dense FFN: `n_ff` sizes nothing, so it takes the experts' width.
        let n_ff = match moe {
            Some(m) => m.n_ff_exp,
            None => n_ff,
        };
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
        let sliding_window = get_usize(f, &k("attention.sliding_window"))?.unwrap_or(0);
        if sliding_window > u32::MAX as usize {
            return Err(FakError::model(format!(
                "metadata {} = {sliding_window} is out of range",
                k("attention.sliding_window")
            )));
        }
        let swa_pattern = swa_pattern(f, &k("attention.sliding_window_pattern"), n_layer)?
            .unwrap_or_else(|| vec![true; n_layer]);
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
            sliding_window,
            swa_pattern,
            moe,
            hybrid,
        })
    }

    /// The attention shape (`scale = 1/sqrt(head_dim)`), without a window (see
    /// [`Self::layer_attn`]).
    pub fn attn(&self) -> AttnParams {
        AttnParams {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: None,
        }
    }

    /// The sliding window of layer `il` in tokens, or `None` for full causal attention.
    pub fn layer_window(&self, il: usize) -> Option<u32> {
        (self.sliding_window > 0 && self.swa_pattern.get(il).copied().unwrap_or(false))
            .then_some(self.sliding_window as u32)
    }

    /// The attention of layer `il`: [`Self::attn`] with the layer's window.
    pub fn layer_attn(&self, il: usize) -> AttnParams {
        AttnParams {
            window: self.layer_window(il),
            ..self.attn()
        }
    }

    /// The window that bounds a sequence's KV memory: `Some(W)` when every layer is windowed
    /// (then no query ever reads a key more than `W − 1` positions back, and the engine returns
    /// older KV blocks to the pool), else `None` (a full-attention layer needs every position).
    pub fn kv_window(&self) -> Option<usize> {
        (self.sliding_window > 0 && self.swa_pattern.iter().all(|&w| w)).then_some(self.sliding_window)
    }

    /// Sets the sliding window to `window` tokens over the file's (`0`: no window); the layers
    /// that take it stay the file's pattern (every layer when the file has none).
    ///
    /// Errors: [`FakError::InvalidArgument`] for a window past `u32::MAX`.
    pub fn set_sliding_window(&mut self, window: usize) -> Result<()> {
        if window > u32::MAX as usize {
            return Err(FakError::invalid("sliding_window", format!("{window} is out of range")));
        }
        self.sliding_window = window;
        Ok(())
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

#[cfg(test)]
mod tests {
    //! The sliding-window keys on files built in memory. To add a case, build the metadata with
    //! [`file`] and assert [`ModelConfig::layer_window`] per layer.
    use super::*;

    /// A GGUF value: `(type id, little-endian bytes)`.
    type Val = (u32, Vec<u8>);

    fn u32v(x: u32) -> Val {
        (4, x.to_le_bytes().to_vec())
    }
    fn boolv(x: bool) -> Val {
        (7, vec![x as u8])
    }
    fn arr(elem: u32, items: &[Vec<u8>]) -> Val {
        let mut b = elem.to_le_bytes().to_vec();
        b.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for i in items {
            b.extend_from_slice(i);
        }
        (9, b)
    }
    fn gstr(x: &str) -> Vec<u8> {
        let mut v = (x.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(x.as_bytes());
        v
    }

    /// A `llama` file of `n_layer` layers (n_embd 8, 2 heads) with `extra` metadata and the
    /// token embedding tensor only (the config needs no other tensor).
    fn file(n_layer: u32, extra: &[(&str, Val)]) -> GgufFile {
        let mut kv: Vec<(String, Val)> = vec![
            ("general.architecture".into(), (8, gstr("llama"))),
            ("llama.block_count".into(), u32v(n_layer)),
            ("llama.embedding_length".into(), u32v(8)),
            ("llama.feed_forward_length".into(), u32v(16)),
            ("llama.attention.head_count".into(), u32v(2)),
            ("llama.attention.layer_norm_rms_epsilon".into(), (6, 1e-5f32.to_le_bytes().to_vec())),
        ];
        kv.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        for (k, (t, v)) in &kv {
            b.extend(gstr(k));
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(v);
        }
        b.extend(gstr("token_embd.weight"));
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&8u64.to_le_bytes());
        b.extend_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // F32
        b.extend_from_slice(&0u64.to_le_bytes());
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.extend(std::iter::repeat_n(0u8, 8 * 4 * 4));
        GgufFile::from_bytes(b).unwrap()
    }

    fn windows(c: &ModelConfig) -> Vec<Option<u32>> {
        (0..c.n_layer).map(|il| c.layer_window(il)).collect()
    }

    #[test]
    fn no_window_keys_is_full_attention_everywhere() {
        let c = ModelConfig::from_gguf(&file(3, &[])).unwrap();
        assert_eq!((c.sliding_window, c.kv_window()), (0, None));
        assert_eq!(windows(&c), vec![None; 3]);
        assert_eq!(c.layer_attn(1), c.attn());
        // A pattern alone (no window) windows nothing.
        let c = ModelConfig::from_gguf(&file(2, &[("llama.attention.sliding_window_pattern", u32v(2))])).unwrap();
        assert_eq!(windows(&c), vec![None; 2]);
    }

    #[test]
    fn window_without_pattern_covers_every_layer() {
        let c = ModelConfig::from_gguf(&file(3, &[("llama.attention.sliding_window", u32v(64))])).unwrap();
        assert_eq!(windows(&c), vec![Some(64); 3]);
        assert_eq!(c.kv_window(), Some(64));
        assert_eq!(c.layer_attn(2).window, Some(64));
        assert_eq!(c.layer_attn(2).window_start(63), 0);
        assert_eq!(c.layer_attn(2).window_start(64), 1, "64 keys: positions 1..=64");
    }

    #[test]
    fn per_layer_arrays_bool_and_integer() {
        let w = ("llama.attention.sliding_window", u32v(16));
        let bools = arr(7, &[vec![1], vec![0], vec![1]]);
        let c = ModelConfig::from_gguf(&file(3, &[w.clone(), ("llama.attention.sliding_window_pattern", bools)])).unwrap();
        assert_eq!(windows(&c), vec![Some(16), None, Some(16)]);
        assert_eq!(c.kv_window(), None, "a full-attention layer keeps every position");
        let ints = arr(5, &[0i32.to_le_bytes().to_vec(), 3i32.to_le_bytes().to_vec(), 1i32.to_le_bytes().to_vec()]);
        let c = ModelConfig::from_gguf(&file(3, &[w.clone(), ("llama.attention.sliding_window_pattern", ints)])).unwrap();
        assert_eq!(windows(&c), vec![None, Some(16), Some(16)]);
        // Wrong length: an error naming the key.
        let short = arr(7, &[vec![1], vec![0]]);
        let e = ModelConfig::from_gguf(&file(3, &[w, ("llama.attention.sliding_window_pattern", short)])).unwrap_err();
        assert!(matches!(e, FakError::Model(ref m) if m.contains("sliding_window_pattern has 2 entries for 3 layers")), "{e}");
    }

    #[test]
    fn scalar_pattern_is_llamacpp_set_swa_pattern() {
        let w = ("llama.attention.sliding_window", u32v(8));
        let get = |pat: Val| windows(&ModelConfig::from_gguf(&file(6, &[w.clone(), ("llama.attention.sliding_window_pattern", pat)])).unwrap());
        let on = Some(8);
        // gemma2's 2: even layers windowed; gemma3's 6: five windowed, then one full.
        assert_eq!(get(u32v(2)), vec![on, None, on, None, on, None]);
        assert_eq!(get(u32v(6)), vec![on, on, on, on, on, None]);
        assert_eq!(get(u32v(3)), vec![on, on, None, on, on, None]);
        assert_eq!(get(u32v(0)), vec![on; 6], "0: every layer");
        assert_eq!(get(u32v(1)), vec![None; 6], "1: no layer (il % 1 < 0 never holds)");
        assert_eq!(get(boolv(true)), vec![on; 6]);
        assert_eq!(get(boolv(false)), vec![None; 6]);
    }

    #[test]
    fn override_replaces_the_window_and_keeps_the_pattern() {
        let bools = arr(7, &[vec![0], vec![1]]);
        let mut c = ModelConfig::from_gguf(&file(2, &[("llama.attention.sliding_window", u32v(16)), ("llama.attention.sliding_window_pattern", bools)])).unwrap();
        c.set_sliding_window(4).unwrap();
        assert_eq!(windows(&c), vec![None, Some(4)]);
        c.set_sliding_window(0).unwrap();
        assert_eq!(windows(&c), vec![None, None]);
        let mut c = ModelConfig::from_gguf(&file(2, &[])).unwrap();
        c.set_sliding_window(32).unwrap();
        assert_eq!((windows(&c), c.kv_window()), (vec![Some(32); 2], Some(32)));
    }
}
