//! Compute backends: the [`Backend`] trait (the ops one transformer forward pass needs) and its
//! implementations, `cpu` (the reference) and, later, `cuda`.
//!
//! The shape of the trait follows candle's `backend.rs` (one trait, a folder per device) and
//! vLLM's attention-metadata split: the engine describes a batch on the host ([`BatchPlan`]:
//! token ids, positions, KV slots, per-sequence rows and block tables, rows that need logits), the
//! backend copies it once per forward into its own [`Backend::Batch`] (host vectors on CPU,
//! persistent device buffers on CUDA), and every op reads positions, slots and block tables from
//! there. A CUDA decode graph therefore never changes between tokens: only the contents of the
//! batch buffers do. [`Backend::run_forward`] is the hook where a backend captures or replays it.
//!
//! Weights stay in their GGUF block formats ([`Backend::Weight`]): on CPU a slice of the file's
//! memory map, on CUDA a device copy of the same blocks.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod optest;
pub mod sampling;

use std::any::Any;
use std::sync::Arc;

use crate::quant::GgmlType;
pub use sampling::{DrawRequest, DrawnRows, LogitPenalty, TopRows};
use crate::Result;

/// A tensor as the loader hands it to [`Backend::load_weight`]: GGUF blocks in host memory.
///
/// `dims` are in ggml order (`dims[0]` contiguous): a matrix of `n_out` rows of `k` inputs has
/// `dims = [k, n_out]`; a vector has `dims = [n]`.
#[derive(Clone)]
pub struct HostTensor<'a> {
    /// Tensor name, for error messages.
    pub name: &'a str,
    /// Block format of `data`.
    pub wtype: GgmlType,
    /// Shape in ggml order.
    pub dims: &'a [usize],
    /// The blocks (`row_bytes(dims[0]) * rows` bytes).
    pub data: &'a [u8],
    /// What keeps `data` alive (the memory-mapped file). A backend that keeps the bytes in place
    /// instead of copying them (the CPU backend) holds a clone of this.
    pub owner: Arc<dyn Any + Send + Sync>,
}

/// RoPE pairing of dimensions, as llama.cpp's `LLAMA_ROPE_TYPE_*` (ggml `rope_f32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// `LLAMA_ROPE_TYPE_NORM` (llama, GPT-J style): rotates adjacent pairs `(2i, 2i+1)`.
    Norm,
    /// `LLAMA_ROPE_TYPE_NEOX` (qwen2, GPT-NeoX style): rotates `(i, i + n_rot/2)`.
    Neox,
}

/// Rotary position embedding parameters of a model.
///
/// The angle of pair `i` at position `p` is ggml's `rope_yarn` (llama.cpp `ggml-cpu/ops.cpp`):
/// with `θ_e = p · base^(−2i/n_rot) / f_i` (the extrapolated angle; `f_i` the optional per-pair
/// frequency factors, llama3-style `rope_freqs.weight`) and `θ_i = freq_scale · θ_e` (the
/// interpolated one; `freq_scale = 1/factor`),
///
/// - without YaRN (`ext_factor == 0`): `θ = θ_i`, `cos`/`sin` times `attn_factor`;
/// - with YaRN (`ext_factor ≠ 0`, Peng et al. 2023): `ramp = 1 − clamp((i − lo)/max(0.001, hi −
///   lo), 0, 1)` over the correction dimensions `corr_dims = [lo, hi]`, `mix = ramp · ext_factor`,
///   `θ = θ_i·(1 − mix) + θ_e·mix`, and `cos`/`sin` times `attn_factor · (1 + 0.1·ln(1/freq_scale))`.
///
/// [`RopeParams::plain`] (no scaling) and linear scaling (`freq_scale < 1` only) leave
/// `ext_factor = 0` and `attn_factor = 1`, so their angles and rotations are the unscaled ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    pub style: RopeStyle,
    /// Rotated dimensions per head (`rope.dimension_count`, ≤ head_dim; the rest pass through).
    pub n_rot: usize,
    /// `rope.freq_base`.
    pub freq_base: f32,
    /// `1 / rope.scaling.factor` for linear and YaRN scaling, else 1.
    pub freq_scale: f32,
    /// YaRN's extrapolation mix (llama.cpp `yarn_ext_factor`): 1 for YaRN, 0 for none/linear.
    pub ext_factor: f32,
    /// Magnitude of `cos`/`sin` (llama.cpp `yarn_attn_factor` after its YaRN correction, times
    /// `rope.scaling.attn_factor`); 1 without scaling.
    pub attn_factor: f32,
    /// YaRN correction dimensions `[lo, hi]` (ggml `ggml_rope_yarn_corr_dims`); unused when
    /// `ext_factor == 0`.
    pub corr_dims: [f32; 2],
}

impl RopeParams {
    /// Unscaled RoPE (`freq_scale = 1`, no YaRN, `attn_factor = 1`).
    pub fn plain(style: RopeStyle, n_rot: usize, freq_base: f32) -> RopeParams {
        RopeParams::linear(style, n_rot, freq_base, 1.0)
    }

    /// Linear position interpolation (`freq_scale = 1/factor`), no YaRN.
    pub fn linear(style: RopeStyle, n_rot: usize, freq_base: f32, freq_scale: f32) -> RopeParams {
        RopeParams {
            style,
            n_rot,
            freq_base,
            freq_scale,
            ext_factor: 0.0,
            attn_factor: 1.0,
            corr_dims: [0.0, 0.0],
        }
    }

    /// YaRN's correction dimensions `[lo, hi]` for `n_rot` rotated dimensions trained at
    /// `n_ctx_orig` tokens: the dimension where a pair turns `β` times over `n_ctx_orig`,
    /// `d(β) = n_rot · ln(n_ctx_orig / (2π·β)) / (2 ln base)`, `lo = max(0, ⌊d(β_fast)⌋)`,
    /// `hi = min(n_rot − 1, ⌈d(β_slow)⌉)` — ggml's `ggml_rope_yarn_corr_dims`, in f32 as there
    /// (llama.cpp's defaults: `β_fast = 32`, `β_slow = 1`).
    pub fn yarn_corr_dims(n_rot: usize, n_ctx_orig: usize, freq_base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
        let dim = |beta: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * freq_base.ln())
        };
        let lo = dim(beta_fast).floor();
        let hi = dim(beta_slow).ceil();
        [lo.max(0.0), hi.min(n_rot as f32 - 1.0)]
    }
}

/// Shape of attention: `n_head` query heads share `n_head_kv` KV heads (GQA); `scale` multiplies
/// `q·k` before the softmax (`1/sqrt(head_dim)`); `window` limits how far back a query looks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Sliding window `W` in tokens (`Some(W)`, `W ≥ 1`): a query at position `p` attends to the
    /// keys at positions `p − W < j ≤ p` only, i.e. `max(0, p + 1 − W) ..= p` (`W` keys with
    /// itself). This is llama.cpp's `LLAMA_SWA_TYPE_STANDARD` (`is_masked_swa`: masked when
    /// `p − j ≥ n_swa`) and Hugging Face's `sliding_window_overlay` (`kv_idx > q_idx −
    /// sliding_window`). `None`: plain causal attention over `0 ..= p`.
    pub window: Option<u32>,
}

impl AttnParams {
    /// The first key position a query at `pos` attends to: `max(0, pos + 1 − W)`, or 0 without a
    /// window.
    #[inline]
    pub fn window_start(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w as usize),
            None => 0,
        }
    }
}

/// Geometry of the paged KV cache a backend allocates: per layer, `n_blocks` blocks of
/// `block_size` token slots, each slot holding `n_head_kv × head_dim` K and V values (f16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layer: usize,
    pub n_blocks: usize,
    pub block_size: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// A hybrid model's recurrent state beside the KV blocks: for each of `state_layers` layers
    /// (the Gated DeltaNet ones, in order) `state_slots` slots of `state_len` f32 values, one slot
    /// per running sequence ([`SeqRows::state_slot`]). 0 for a model without recurrent layers.
    pub state_layers: usize,
    pub state_slots: usize,
    pub state_len: usize,
}

impl KvLayout {
    /// Bytes of K plus V for one token across all layers (f16).
    pub fn bytes_per_token(&self) -> usize {
        2 * 2 * self.n_layer * self.n_head_kv * self.head_dim
    }
}

/// The largest batch a backend must be able to describe (sizes persistent batch buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most tokens (rows) in one forward.
    pub max_tokens: usize,
    /// Most sequences in one forward.
    pub max_seqs: usize,
    /// Most KV blocks one sequence can hold (`ceil(n_ctx / block_size)`).
    pub max_blocks_per_seq: usize,
}

/// A block-table entry for a logical block the sequence no longer holds (released because it lies
/// wholly outside every layer's sliding window). Backends never read it: see
/// [`Backend::attention`].
pub const NO_BLOCK: u32 = u32::MAX;

/// The rows of one sequence inside a batch.
///
/// Rows `row0 .. row0 + n_rows` of the batch are this sequence's new tokens at positions
/// `n_past .. n_past + n_rows`; the sequence's KV blocks are
/// `BatchPlan::block_tables[table0 .. table0 + n_blocks]`. Row `row0 + i` attends causally to the
/// `n_past + i + 1` positions `0 ..= n_past + i` (with a sliding window, only the last `W` of
/// them: [`AttnParams::window`]), all read from the KV cache (the new tokens' K/V are written
/// there first by [`Backend::kv_write`]). Entries of released blocks are [`NO_BLOCK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRows {
    pub row0: u32,
    pub n_rows: u32,
    pub n_past: u32,
    pub table0: u32,
    pub n_blocks: u32,
    /// Length of the sequence's prompt: rows at positions `< n_prompt` are prompt tokens (a
    /// prefill in llama.cpp), the others generated ones (decode steps). The CPU backend picks
    /// llama.cpp's kernel for a row from it (see `backend::cpu::llama_row`). [`BatchPlan::push_seq`]
    /// sets it to `n_past + tokens.len()`; [`BatchPlan::set_prompt_len`] overrides it.
    pub n_prompt: u32,
    /// The sequence's slot of recurrent state (hybrid models; [`KvLayout::state_slots`]): read
    /// as its state before row 0 unless `n_past == 0` (a fresh sequence starts from zeros), and
    /// written with its state after the last row. [`BatchPlan::set_state_slot`] sets it.
    pub state_slot: u32,
}

/// Host description of one forward call (all sequences' new tokens concatenated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPlan {
    /// Token id of each row, `[n_tokens]`.
    pub tokens: Vec<u32>,
    /// Position of each row in its sequence, `[n_tokens]` (RoPE angle and KV slot).
    pub positions: Vec<u32>,
    /// KV slot of each row: `block * block_size + position % block_size`, `[n_tokens]`.
    pub slots: Vec<u32>,
    /// The sequences, in row order.
    pub seqs: Vec<SeqRows>,
    /// All sequences' block tables, concatenated (see [`SeqRows::table0`]).
    pub block_tables: Vec<u32>,
    /// Rows whose logits are wanted, in output order (`[n_logits]`).
    pub logit_rows: Vec<u32>,
}

impl BatchPlan {
    /// Number of rows (tokens) in the batch.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Empties the plan, keeping its allocations.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.slots.clear();
        self.seqs.clear();
        self.block_tables.clear();
        self.logit_rows.clear();
    }

    /// Appends one sequence's `tokens` at positions `n_past..`, with its block table
    /// `blocks` (which must cover every new position) and a KV block size of `block_size`.
    /// When `logits` is `All`, every new row is added to `logit_rows`; `Last` adds the last one.
    pub fn push_seq(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        blocks: &[u32],
        block_size: usize,
        logits: LogitRows,
    ) {
        let row0 = self.tokens.len();
        let table0 = self.block_tables.len();
        for (i, &t) in tokens.iter().enumerate() {
            let pos = n_past + i;
            self.tokens.push(t);
            self.positions.push(pos as u32);
            self.slots
                .push(blocks[pos / block_size] * block_size as u32 + (pos % block_size) as u32);
        }
        self.block_tables.extend_from_slice(blocks);
        self.seqs.push(SeqRows {
            row0: row0 as u32,
            n_rows: tokens.len() as u32,
            n_past: n_past as u32,
            table0: table0 as u32,
            n_blocks: blocks.len() as u32,
            n_prompt: (n_past + tokens.len()) as u32,
            state_slot: 0,
        });
        match logits {
            LogitRows::None => {}
            LogitRows::Last => {
                if !tokens.is_empty() {
                    self.logit_rows.push((row0 + tokens.len() - 1) as u32)
                }
            }
            LogitRows::All => self
                .logit_rows
                .extend((row0..row0 + tokens.len()).map(|r| r as u32)),
        }
    }
}

impl BatchPlan {
    /// Sets the prompt length of the last sequence pushed (see [`SeqRows::n_prompt`]).
    pub fn set_prompt_len(&mut self, n_prompt: usize) {
        if let Some(s) = self.seqs.last_mut() {
            s.n_prompt = n_prompt as u32;
        }
    }

    /// Sets the recurrent-state slot of the last sequence pushed (see [`SeqRows::state_slot`]).
    pub fn set_state_slot(&mut self, slot: usize) {
        if let Some(s) = self.seqs.last_mut() {
            s.state_slot = slot as u32;
        }
    }
}

/// Which rows of a sequence need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    None,
    Last,
    All,
}

/// Identifies a forward whose launch sequence a backend may capture once and replay (a CUDA graph
/// per decode batch-size bucket). Forwards with the same key have identical shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Rows (tokens) in the forward, padded to the bucket.
    pub n_tokens: usize,
    /// Rows that need logits.
    pub n_logits: usize,
}

/// The weights of one mixture-of-experts FFN: the router `gate_inp` (`[n_embd, n_expert]`) and
/// the experts' stacked matrices (`gate_exps` / `up_exps` `[n_embd, n_ff_exp, n_expert]`,
/// `down_exps` `[n_ff_exp, n_embd, n_expert]`, ggml order).
pub struct MoeWeights<'a, W> {
    pub gate_inp: &'a W,
    pub gate_exps: &'a W,
    pub up_exps: &'a W,
    pub down_exps: &'a W,
}

/// The shape of one mixture-of-experts FFN: `k` of `n_expert` experts per row, each an MLP of
/// `n_ff_exp` on rows of `n_embd`; the weights' renormalization and scale (see
/// [`Backend::moe_route`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeParams {
    pub n_embd: usize,
    pub n_expert: usize,
    pub k: usize,
    pub n_ff_exp: usize,
    pub norm_w: bool,
    pub w_scale: f32,
}

/// Scratch of [`Backend::moe_ffn`] for `n` rows: `router` `[n, n_expert]`, `ids` / `weights`
/// `[n, k]`, `gate` / `up` `[n·k, n_ff_exp]`, `experts` `[n·k, n_embd]`.
pub struct MoeBuffers<'a, Buf> {
    pub router: &'a mut Buf,
    pub ids: &'a mut Buf,
    pub weights: &'a mut Buf,
    pub gate: &'a mut Buf,
    pub up: &'a mut Buf,
    pub experts: &'a mut Buf,
}

/// The weights of one Gated DeltaNet layer (llama.cpp `qwen35` `build_layer_attn_linear`):
/// `qkv` `[n_embd, conv_dim]`, `gate` (z) `[n_embd, value_dim]`, `beta` / `alpha`
/// `[n_embd, n_v_heads]`, `conv` `[d_conv, conv_dim]` (F32), `dt_bias` / `a` `[n_v_heads]`,
/// `norm` `[d_state]`, `out` `[value_dim, n_embd]`.
pub struct DeltaNetWeights<'a, W> {
    pub qkv: &'a W,
    pub gate: &'a W,
    pub beta: &'a W,
    pub alpha: &'a W,
    pub conv: &'a W,
    pub dt_bias: &'a W,
    pub a: &'a W,
    pub norm: &'a W,
    pub out: &'a W,
}

/// The shape of a Gated DeltaNet layer (see `crate::model::config::HybridConfig`): which of the
/// cache's state layers it uses (`state_layer`), the RMSNorm epsilon.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaNetParams {
    pub n_embd: usize,
    pub d_conv: usize,
    pub d_state: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub state_layer: usize,
    pub eps: f32,
}

impl DeltaNetParams {
    /// `n_v_heads · d_state`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_state
    }
    /// `2·n_k_heads·d_state + value_dim`.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.d_state + self.value_dim()
    }
}

/// The ops of a decoder-only transformer forward pass, on backend-owned buffers.
///
/// Buffers are flat `f32` activation arrays with a fixed capacity; each op is told how many rows
/// it covers. Every op may run asynchronously: results are only guaranteed after
/// [`Backend::read_f32`] or [`Backend::synchronize`]. All methods return `Err` instead of panicking
/// on a backend failure; shape mismatches are programming errors of the caller (the forward pass)
/// and are checked with debug assertions.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A weight in its GGUF block format (matrices), or as f32 (norm weights, biases).
    type Weight: Send + Sync;
    /// An activation buffer of `f32`.
    type Buffer: Send;
    /// The paged KV cache storage of all layers.
    type KvCache: Send;
    /// A batch description in the backend's memory (see [`BatchPlan`]).
    type Batch: Send;
    /// Host memory that [`Backend::read_f32`] fills fastest (the engine's copy of the logits
    /// rows it samples on the CPU): a `Vec` on the CPU, page-locked memory on CUDA.
    type HostBuf: std::ops::DerefMut<Target = [f32]> + Send;

    /// Short name (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// Takes a weight from the file. Matrices keep their block format; 1-D tensors (norms,
    /// biases, RoPE frequency factors) may be converted to f32.
    fn load_weight(&self, t: &HostTensor<'_>) -> Result<Self::Weight>;

    /// Takes a weight that stays in host memory (the file's map) while the backend computes
    /// with it there: the MoE experts of `--cpu-moe` / `--n-cpu-moe` layers, which
    /// [`Backend::moe_ffn`] then runs on the CPU. The default is [`Backend::load_weight`] (on the
    /// CPU backend everything is in host memory already).
    fn load_weight_host(&self, t: &HostTensor<'_>) -> Result<Self::Weight> {
        self.load_weight(t)
    }

    /// A zeroed activation buffer of `n` f32 elements.
    fn alloc_buffer(&self, n: usize) -> Result<Self::Buffer>;

    /// A zeroed KV cache of the given geometry.
    fn alloc_kv_cache(&self, layout: KvLayout) -> Result<Self::KvCache>;

    /// Storage for batches up to `limits`.
    fn alloc_batch(&self, limits: BatchLimits) -> Result<Self::Batch>;

    /// Copies `plan` into `batch` (the only host → device transfer of a forward).
    fn set_batch(&self, batch: &mut Self::Batch, plan: &BatchPlan) -> Result<()>;

    /// Runs `f` (one whole forward). A backend may capture the launches under `key` once and
    /// replay them afterwards; the default runs `f` directly.
    fn run_forward(&self, key: Option<GraphKey>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let _ = key;
        f()
    }

    /// Waits until every queued op has finished.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// `out[r, :] = table[batch.tokens[r], :]` dequantized, for the batch's `n_tokens` rows.
    /// `table` has `dims = [n_embd, n_vocab]`.
    fn embed(
        &self,
        table: &Self::Weight,
        batch: &Self::Batch,
        n_tokens: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// RMSNorm: `out[r, i] = x[r, i] / sqrt(mean_i(x[r, :]²) + eps) · w[i]` over `n_rows` rows
    /// of `dim` elements (Zhang & Sennrich 2019; ggml `rms_norm` followed by `mul`).
    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &Self::Weight,
        eps: f32,
        n_rows: usize,
        dim: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// `out[r, o] = Σ_i W[o, i] · x[r, i] (+ bias[o])` for `n_rows` rows; `W` has
    /// `dims = [k, n_out]`, `x` is `[n_rows, k]`, `out` is `[n_rows, n_out]`.
    fn matmul(
        &self,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        x: &Self::Buffer,
        n_rows: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Several matmuls of the same input: `outs[i] = x · W_iᵀ (+ b_i)` (Q/K/V, gate/up). The
    /// default runs them one after another; a backend may overlap them (the CPU backend runs them
    /// in one parallel region, saving a thread barrier per matmul).
    fn matmul_multi(
        &self,
        ws: &[(&Self::Weight, Option<&Self::Weight>)],
        x: &Self::Buffer,
        n_rows: usize,
        outs: &mut [&mut Self::Buffer],
    ) -> Result<()> {
        debug_assert_eq!(ws.len(), outs.len());
        for ((w, b), out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, *b, x, n_rows, out)?;
        }
        Ok(())
    }

    /// `res[r, o] += Σ_i W[o, i] · x[r, i] (+ bias[o])` for `n_rows` rows of `n_out` outputs: a
    /// projection followed by the residual add. The default runs [`Backend::matmul`] into `tmp`
    /// (`[n_rows, n_out]` scratch) and then [`Backend::add`]; a backend may add in the matmul's
    /// epilogue instead (same arithmetic: each output is rounded to f32, then added).
    #[allow(clippy::too_many_arguments)]
    fn matmul_add(
        &self,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        x: &Self::Buffer,
        n_rows: usize,
        n_out: usize,
        tmp: &mut Self::Buffer,
        res: &mut Self::Buffer,
    ) -> Result<()> {
        self.matmul(w, bias, x, n_rows, tmp)?;
        self.add(res, tmp, n_rows * n_out)
    }

    /// Rotates `x` (`[n_rows, n_heads, head_dim]`) in place by each row's position in `batch`.
    /// `freq_factors` (`[n_rot/2]`) divides the angle of each pair when given.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Self::Buffer,
        batch: &Self::Batch,
        n_rows: usize,
        n_heads: usize,
        head_dim: usize,
        rope: &RopeParams,
        freq_factors: Option<&Self::Weight>,
    ) -> Result<()>;

    /// Writes each row's K and V (`[n_rows, n_head_kv · head_dim]`) into its KV slot of `layer`
    /// (rounded to f16).
    fn kv_write(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Buffer,
        v: &Self::Buffer,
        batch: &Self::Batch,
        n_rows: usize,
    ) -> Result<()>;

    /// What the attention block runs between the Q/K/V projections and [`Backend::attention`]:
    /// with `qk_norm = Some((w_q, w_k, eps))` (Qwen3) first the RMSNorm of each head of `q` and
    /// `k` in place ([`Backend::rmsnorm_inplace`]), then RoPE of `q` (`n_head` heads) and `k`
    /// (`n_head_kv` heads), then [`Backend::kv_write`] of the rotated `k` and `v`. The default
    /// runs the ops one by one; a backend may fuse them.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write(
        &self,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        v: &Self::Buffer,
        cache: &mut Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
        n_rows: usize,
        attn: &AttnParams,
        rope: &RopeParams,
        freq_factors: Option<&Self::Weight>,
        qk_norm: Option<(&Self::Weight, &Self::Weight, f32)>,
    ) -> Result<()> {
        if let Some((wq, wk, eps)) = qk_norm {
            self.rmsnorm_inplace(q, wq, eps, n_rows * attn.n_head, attn.head_dim)?;
            self.rmsnorm_inplace(k, wk, eps, n_rows * attn.n_head_kv, attn.head_dim)?;
        }
        self.rope(q, batch, n_rows, attn.n_head, attn.head_dim, rope, freq_factors)?;
        self.rope(k, batch, n_rows, attn.n_head_kv, attn.head_dim, rope, freq_factors)?;
        self.kv_write(cache, layer, k, v, batch, n_rows)
    }

    /// Causal grouped-query attention of every row of `batch` over its sequence's KV cache of
    /// `layer`: `out[r, h, :] = softmax(scale · q[r, h, :] · K[s_r..=pos_r]ᵀ) · V[s_r..=pos_r]` with
    /// K/V of KV head `h / (n_head / n_head_kv)` and `s_r = params.window_start(pos_r)` (0 without
    /// a sliding window). `q` is `[n_rows, n_head · head_dim]`, `out` the same shape.
    ///
    /// With a window, the blocks of a sequence's table that lie wholly before `s_r` of its first
    /// row are never read: the engine may have returned them to the pool and put
    /// [`NO_BLOCK`] in their place.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buffer,
        cache: &Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
        n_rows: usize,
        params: &AttnParams,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// SwiGLU: `gate[i] = silu(gate[i]) · up[i]` for the first `n` elements
    /// (Shazeer 2020, `silu(x) = x / (1 + e^−x)`).
    fn swiglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()>;

    /// RMSNorm of each of `n_rows` rows of `dim` elements in place, times `w` (`[dim]`), with the
    /// arithmetic of [`Backend::rmsnorm`]: Qwen3's per-head norm of Q and K (`n_rows` = tokens ×
    /// heads, `dim` = head_dim; llama.cpp `build_norm` on the `[head_dim, n_head, n_tokens]` view).
    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &Self::Weight, eps: f32, n_rows: usize, dim: usize) -> Result<()>;

    /// The mixture-of-experts router of `n_rows` rows (llama.cpp `build_moe_ffn`, softmax
    /// gating): `logits` is `[n_rows, n_expert]` (`x·W_gate_inp`). Per row, `p = softmax(logits)`,
    /// the `k` experts of largest `p` in ggml `argsort_top_k`'s order (descending; the CPU breaks
    /// ties as llama.cpp's CPU build does, see `cpu::stdsort`), written as f32 values to
    /// `ids[r·k + s]`; their weights `p[e]` to `weights[r·k + s]`, divided by their f32 sum
    /// (clamped below at 2⁻¹⁴) when `norm_w`, times `w_scale` unless it is 0 or 1.
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        logits: &Self::Buffer,
        n_rows: usize,
        n_expert: usize,
        k: usize,
        norm_w: bool,
        w_scale: f32,
        ids: &mut Self::Buffer,
        weights: &mut Self::Buffer,
    ) -> Result<()>;

    /// Expert matmul (ggml `mul_mat_id`) over the `n_rows · k` (row, chosen expert) pairs:
    /// `out[r·k + s, :] = W_e · x[i, :]` with `e = ids[r·k + s]` and `i = r·k + s` when
    /// `x_per_pair` (each pair its own input: the down projection), else `i = r` (the chosen
    /// experts of a row read its one input: up, gate). `w` stacks the experts' matrices (`dims =
    /// [k_in, n_out, n_expert]`), `out` is `[n_rows·k, n_out]`. The ids stay on the backend: no
    /// host round trip. An id of −1 ([`Backend::moe_localize`]) leaves its pair out (a zero row).
    #[allow(clippy::too_many_arguments)]
    fn matmul_id(
        &self,
        w: &Self::Weight,
        x: &Self::Buffer,
        ids: &Self::Buffer,
        n_rows: usize,
        k: usize,
        x_per_pair: bool,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// A tensor-parallel shard's view of the routing when the experts are divided among the
    /// shards: of the first `n_pairs` chosen experts, those in `[e0, e1)` (the shard's) become
    /// `id − e0` (the index in its stack); the others become −1 with weight 0. [`Backend::matmul_id`]
    /// skips a pair with id −1 (its output row is 0), so [`Backend::moe_combine`] adds only the
    /// shard's experts. A backend that cannot skip such pairs returns
    /// [`crate::FakError::Unsupported`].
    fn moe_localize(&self, ids: &mut Self::Buffer, weights: &mut Self::Buffer, n_pairs: usize, e0: usize, e1: usize) -> Result<()>;

    /// The weighted sum of the chosen experts' outputs added to the residual: `res[r, :] +=
    /// Σ_s weights[r·k + s] · experts[r·k + s, :]` for `n_rows` rows of `dim`, each product
    /// rounded to f32 and summed in slot order before the add (llama.cpp: `ggml_mul`, a chain of
    /// `ggml_add`, then the residual `ggml_add`).
    #[allow(clippy::too_many_arguments)]
    fn moe_combine(
        &self,
        experts: &Self::Buffer,
        weights: &Self::Buffer,
        n_rows: usize,
        k: usize,
        dim: usize,
        res: &mut Self::Buffer,
    ) -> Result<()>;

    /// One Gated DeltaNet layer over the batch: `out[r, :]` (`[n_rows, n_embd]`) = the layer's
    /// mixer output for rows `h` (`[n_rows, n_embd]`, already RMS-normalized), each sequence's
    /// rows in order from its recurrent state in `cache` (slot [`SeqRows::state_slot`] of state
    /// layer `p.state_layer`; zeros when its `n_past == 0`), which is left holding the state after
    /// its last row. llama.cpp `qwen35` `build_layer_attn_linear` with the fused
    /// `ggml_gated_delta_net` (see `cpu::deltanet`). The default: unsupported.
    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        w: &DeltaNetWeights<'_, Self::Weight>,
        p: &DeltaNetParams,
        h: &Self::Buffer,
        cache: &mut Self::KvCache,
        batch: &Self::Batch,
        n_rows: usize,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let _ = (w, p, h, cache, batch, n_rows, out);
        Err(crate::FakError::Unsupported(format!("Gated DeltaNet layers (hybrid models) on the {} backend", self.name())))
    }

    /// Copies a hybrid model's recurrent state from slot `from` to slot `to` (every state layer;
    /// the prefix cache's checkpoints). The default: unsupported.
    fn copy_state(&self, cache: &mut Self::KvCache, from: usize, to: usize) -> Result<()> {
        let _ = (cache, from, to);
        Err(crate::FakError::Unsupported(format!("recurrent state on the {} backend", self.name())))
    }

    /// Gated attention's split of the query projection (llama.cpp `qwen35` `build_layer_attn`):
    /// `qg` is `[n_rows, n_head, 2·head_dim]` (each head's query then its gate); writes the queries
    /// to `q` and the gates to `gate`, each `[n_rows, n_head·head_dim]`. The default: unsupported.
    fn split_q_gate(&self, qg: &Self::Buffer, n_rows: usize, n_head: usize, head_dim: usize, q: &mut Self::Buffer, gate: &mut Self::Buffer) -> Result<()> {
        let _ = (qg, n_rows, n_head, head_dim, q, gate);
        Err(crate::FakError::Unsupported(format!("gated attention on the {} backend", self.name())))
    }

    /// `x[r, :] *= sigmoid(g[r])` for `n_rows` rows of `dim` (ggml `mul` of a row by a broadcast
    /// `sigmoid` of one value: the shared expert's gate). The default: unsupported.
    fn mul_rows_sigmoid(&self, x: &mut Self::Buffer, g: &Self::Buffer, n_rows: usize, dim: usize) -> Result<()> {
        let _ = (x, g, n_rows, dim);
        Err(crate::FakError::Unsupported(format!("a shared expert's gate on the {} backend", self.name())))
    }

    /// `x[i] *= sigmoid(gate[i])` for the first `n` elements (ggml `ggml_mul(x, ggml_sigmoid(g))`).
    /// The default: unsupported.
    fn mul_sigmoid(&self, x: &mut Self::Buffer, gate: &Self::Buffer, n: usize) -> Result<()> {
        let _ = (x, gate, n);
        Err(crate::FakError::Unsupported(format!("gated attention on the {} backend", self.name())))
    }

    /// A whole mixture-of-experts FFN of `n_rows` rows: `res[r, :] += Σ_s w_s ·
    /// (silu(h_r·Wgate_e) ⊙ h_r·Wup_e)·Wdown_e` over the `k` experts `e = e_s` the router picks
    /// for row `r` (llama.cpp `build_moe_ffn`). The default runs [`Backend::matmul`] (the
    /// router), [`Backend::moe_route`], [`Backend::matmul_id`] (up, gate), [`Backend::swiglu`],
    /// [`Backend::matmul_id`] (down) and [`Backend::moe_combine`]; a backend may reorder the
    /// pairs (a grouped GEMM by expert) as long as each pair's products are the same.
    fn moe_ffn(&self, h: &Self::Buffer, w: &MoeWeights<'_, Self::Weight>, p: &MoeParams, n_rows: usize, s: MoeBuffers<'_, Self::Buffer>, res: &mut Self::Buffer) -> Result<()> {
        let k = p.k;
        self.matmul(w.gate_inp, None, h, n_rows, s.router)?;
        self.moe_route(s.router, n_rows, p.n_expert, k, p.norm_w, p.w_scale, s.ids, s.weights)?;
        self.matmul_id(w.up_exps, h, s.ids, n_rows, k, false, s.up)?;
        self.matmul_id(w.gate_exps, h, s.ids, n_rows, k, false, s.gate)?;
        self.swiglu(s.gate, s.up, n_rows * k * p.n_ff_exp)?;
        self.matmul_id(w.down_exps, s.gate, s.ids, n_rows, k, true, s.experts)?;
        self.moe_combine(s.experts, s.weights, n_rows, k, p.n_embd, res)
    }

    /// Residual add: `x[i] += y[i]` for the first `n` elements.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> Result<()>;

    /// `x[i] = 0` for the first `n` elements (a tensor-parallel shard's MoE FFN sums its partial
    /// output into a zeroed buffer, to be all-reduced before the residual add).
    fn zero(&self, x: &mut Self::Buffer, n: usize) -> Result<()>;

    /// `out[j, :] = x[batch.logit_rows[j], :]` for every logit row; rows have `dim` elements.
    fn gather_logit_rows(
        &self,
        x: &Self::Buffer,
        batch: &Self::Batch,
        dim: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Copies the first `out.len()` elements of `buf` to the host.
    fn read_f32(&self, buf: &Self::Buffer, out: &mut [f32]) -> Result<()>;

    /// A host buffer of `n` elements (contents unspecified) for [`Backend::read_f32`].
    fn host_buffer(&self, n: usize) -> Result<Self::HostBuf>;

    /// Index of the largest element of each of `n_rows` rows of `n_cols` (ties: lowest index).
    fn argmax_rows(
        &self,
        x: &Self::Buffer,
        n_rows: usize,
        n_cols: usize,
        out: &mut [u32],
    ) -> Result<()>;

    /// The greedy fast path over logits rows: `tokens[r]` = argmax of row `r` (lowest index on
    /// ties) and `logprobs[r]` = its log-softmax, so the engine need not copy `n_rows · n_cols`
    /// logits to the host when every sequence decodes greedily. A GPU backend runs it on the
    /// device and copies back `2 · n_rows` numbers; the default reads the rows to the host.
    fn greedy_rows(
        &self,
        x: &Self::Buffer,
        n_rows: usize,
        n_cols: usize,
        tokens: &mut [u32],
        logprobs: &mut [f32],
    ) -> Result<()> {
        let mut host = vec![0f32; n_rows * n_cols];
        self.read_f32(x, &mut host)?;
        for r in 0..n_rows {
            let row = &host[r * n_cols..(r + 1) * n_cols];
            let (t, lp) = greedy_row(row);
            tokens[r] = t;
            logprobs[r] = lp;
        }
        Ok(())
    }

    /// Whether the engine samples with the ops below (the logits stay on the backend and only
    /// candidates, ids and a few numbers come back) instead of copying every logits row to the
    /// host: where that copy costs (a GPU). `FAK_DEVICE_SAMPLING=0/1` overrides it per engine.
    fn samples_on_device(&self) -> bool {
        false
    }

    /// The exact top `m` (`1 ≤ m ≤ min(n_cols, 1024)`) of each row listed in `rows` (rows of
    /// `n_cols` in `x`), with each row's max and `Σ e^(x − max)`: see [`TopRows`]. `out` is reset
    /// to `rows.len()` rows.
    fn top_rows(&self, x: &Self::Buffer, n_cols: usize, rows: &[u32], m: usize, out: &mut TopRows) -> Result<()> {
        out.reset(rows.len(), m);
        let mut row = vec![0f32; n_cols];
        for (r, &src) in rows.iter().enumerate() {
            self.read_row_f32(x, src as usize, n_cols, &mut row)?;
            sampling::top_row(&row, m, out, r);
        }
        Ok(())
    }

    /// Applies `pens` (distinct `(row, token)` pairs) to the logits in place, writing each logit's
    /// value before into `raw`.
    fn penalize_rows(&self, x: &mut Self::Buffer, n_cols: usize, pens: &[LogitPenalty], raw: &mut [f32]) -> Result<()>;

    /// One whole-row temperature draw per request (see [`DrawRequest`]), with each row's
    /// normalizer (see [`DrawnRows`]). `out` is reset to `draws.len()` draws.
    fn draw_rows(&self, x: &Self::Buffer, n_cols: usize, draws: &[DrawRequest], out: &mut DrawnRows) -> Result<()> {
        out.reset(draws.len());
        let mut row = vec![0f32; n_cols];
        let mut w = Vec::new();
        for (i, d) in draws.iter().enumerate() {
            self.read_row_f32(x, d.row as usize, n_cols, &mut row)?;
            out.reference(i, &row, d, &mut w);
        }
        Ok(())
    }

    /// Copies row `row` of `n_cols` elements of `x` to `out` (`out.len() == n_cols`).
    fn read_row_f32(&self, x: &Self::Buffer, row: usize, n_cols: usize, out: &mut [f32]) -> Result<()>;
}

/// `(argmax, log-softmax at the argmax)` of one row of logits (lowest index on ties; NaN never
/// wins). The log-softmax is `x[t] − max − ln Σ e^(x − max)`, with the sum in f64.
pub fn greedy_row(row: &[f32]) -> (u32, f32) {
    let t = cpu::argmax(row);
    let max = row[t];
    let z = cpu::vecops::exp_scaled_sum(row, max, 1.0, None);
    (t as u32, (row[t] - max) - z.ln() as f32)
}
