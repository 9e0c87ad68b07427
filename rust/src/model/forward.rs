//! The forward pass of a pre-norm decoder-only transformer (Llama / Qwen2 family), written once
//! against the [`Backend`] trait:
//!
//! ```text
//! x = embed(tokens)
//! per block:  h = rmsnorm(x)·w_attn_norm
//!             q, k, v = h·Wq (+bq), h·Wk (+bk), h·Wv (+bv)
//!             (qwen3: q, k = rmsnorm(q)·w_q_norm, rmsnorm(k)·w_k_norm per head);  rope(q), rope(k)
//!             kv_write(k, v);  x += attention(q, KV cache)·Wo (+bo)
//!             (the layer's sliding window, if it has one: `ModelConfig::layer_attn`)
//!             (rope + rope + kv_write is one trait call, `rope_kv_write`, and each projection
//!             followed by its residual add is `matmul_add`, so a backend can fuse them)
//!             h = rmsnorm(x)·w_ffn_norm;  x += (silu(h·Wgate) ⊙ h·Wup)·Wdown
//!             (MoE: e, w = route(h·W_gate_inp);  x += Σ_s w_s · (silu(h·Wgate[e_s]) ⊙ h·Wup[e_s])·Wdown[e_s])
//! logits = rmsnorm(x[logit rows])·w_out_norm · W_out
//! ```
//!
//! (llama.cpp `build_llama` / `build_qwen2` / `qwen3` / `qwen3moe`, `build_moe_ffn`.) Only the rows that need logits go through the last
//! block's output projection and MLP, the final norm and the LM head, as llama.cpp's `inp_out_ids`
//! (a prefill chunk that needs no logits skips them altogether).
//!
//! The same code runs one tensor-parallel shard ([`Model::forward_tp`], `crate::parallel`): the
//! shard's weights and config hold only its heads, FFN columns (of a MoE layer: its experts, or
//! its columns of every expert) and vocabulary slice, `att·Wo` and the MLP's `·Wdown` (the MoE FFN's `Σ_s w_s·…·Wdown[e_s]`)
//! are partial sums that one all-reduce each completes before the residual add, and the LM head's
//! slices are gathered on rank 0.

use super::weights::{Ffn, LayerWeights, Mixer};
use super::{Model, ModelConfig};
use crate::backend::{Backend, BatchLimits, BatchPlan, DeltaNetParams, DeltaNetWeights, GraphKey, MoeBuffers, MoeParams, MoeWeights};
use crate::parallel::Communicator;
use crate::{FakError, Result};

/// What one tensor-parallel shard's forward ([`Model::forward_tp`]) needs besides its weights:
/// the communicator of its group, and on rank 0 the buffer the logits are gathered into.
pub struct TensorParallel<'a, B: Backend> {
    pub comm: &'a dyn Communicator<B>,
    /// Rank 0: `[max_logits, n_vocab]` of the whole model, receiving every rank's vocabulary
    /// slice side by side; `None` on the other ranks.
    pub logits: Option<&'a mut B::Buffer>,
}

/// Activation buffers and the batch storage of one forward, sized once for the largest batch.
pub struct Scratch<B: Backend> {
    /// Most rows (tokens) per forward.
    pub max_tokens: usize,
    /// Most rows that need logits per forward.
    pub max_logits: usize,
    x: B::Buffer,
    h: B::Buffer,
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    att: B::Buffer,
    att_l: B::Buffer,
    tmp: B::Buffer,
    gate: B::Buffer,
    up: B::Buffer,
    xl: B::Buffer,
    /// `[max_logits, n_vocab]` logits of the last forward.
    pub logits: B::Buffer,
    batch: B::Batch,
    /// The mixture-of-experts FFN's buffers (a MoE model only).
    moe: Option<MoeScratch<B>>,
    /// Gated attention's buffers (a hybrid model only).
    hybrid: Option<HybridScratch<B>>,
}

/// Gated attention's query projection (`[t, n_head, 2·head_dim]`: query then gate per head) and
/// its gates (`[t, q_dim]`).
struct HybridScratch<B: Backend> {
    qg: B::Buffer,
    gate: B::Buffer,
}

/// Buffers of a mixture-of-experts FFN for `t` rows choosing `k` experts each (the experts'
/// gate and up outputs live in [`Scratch`]'s `gate` / `up`, `[t·k, n_ff_exp]`).
struct MoeScratch<B: Backend> {
    /// `[t, n_expert]` router logits.
    router: B::Buffer,
    /// `[t, k]` chosen experts (as f32 values) and their weights.
    ids: B::Buffer,
    weights: B::Buffer,
    /// `[t·k, n_embd]` each chosen expert's output.
    experts: B::Buffer,
}

impl<B: Backend> Scratch<B> {
    /// Buffers for up to `limits.max_tokens` rows and `max_logits` logit rows.
    pub fn new(model: &Model<B>, limits: BatchLimits, max_logits: usize) -> Result<Scratch<B>> {
        let c = &model.config;
        let b = &model.backend;
        let t = limits.max_tokens;
        let wide = c.n_embd.max(c.q_dim());
        // A MoE FFN runs each row through k experts of n_ff (= n_ff_exp) each.
        let ffn_rows = c.moe.map_or(1, |m| m.n_expert_used);
        // (a shared expert's SwiGLU runs in the same buffers: n_ff_shexp a row)
        let ffn_width = (ffn_rows * c.n_ff).max(c.moe.map_or(0, |m| m.n_ff_shexp));
        let moe = match c.moe {
            None => None,
            Some(m) => Some(MoeScratch {
                router: b.alloc_buffer(t * m.n_expert)?,
                ids: b.alloc_buffer(t * m.n_expert_used)?,
                weights: b.alloc_buffer(t * m.n_expert_used)?,
                experts: b.alloc_buffer(t * m.n_expert_used * c.n_embd)?,
            }),
        };
        Ok(Scratch {
            max_tokens: t,
            max_logits,
            x: b.alloc_buffer(t * c.n_embd)?,
            h: b.alloc_buffer(t * wide)?,
            q: b.alloc_buffer(t * c.q_dim())?,
            k: b.alloc_buffer(t * c.kv_dim())?,
            v: b.alloc_buffer(t * c.kv_dim())?,
            att: b.alloc_buffer(t * wide)?,
            att_l: b.alloc_buffer(max_logits * wide)?,
            tmp: b.alloc_buffer(t * c.n_embd)?,
            gate: b.alloc_buffer(t * ffn_width)?,
            up: b.alloc_buffer(t * ffn_width)?,
            xl: b.alloc_buffer(max_logits * c.n_embd)?,
            logits: b.alloc_buffer(max_logits * c.n_vocab)?,
            batch: b.alloc_batch(limits)?,
            moe,
            hybrid: match c.hybrid {
                None => None,
                Some(_) => Some(HybridScratch { qg: b.alloc_buffer(t * 2 * c.q_dim())?, gate: b.alloc_buffer(t * c.q_dim())? }),
            },
        })
    }
}

impl<B: Backend> Model<B> {
    /// Runs one forward over `plan` (all sequences' new tokens): writes their K/V into `kv` and
    /// leaves the logits of `plan.logit_rows` in `scratch.logits` (`[n_logits, n_vocab]`, in the
    /// order of `logit_rows`). Returns `n_logits`.
    ///
    /// Errors: [`FakError::InvalidArgument`] when the batch exceeds the scratch limits or a token
    /// id is outside the vocabulary; backend errors.
    pub fn forward(&self, kv: &mut B::KvCache, s: &mut Scratch<B>, plan: &BatchPlan) -> Result<usize> {
        self.forward_tp(kv, s, plan, None)
    }

    /// [`Self::forward`] of one tensor-parallel shard when `tp` is given: `self` holds the shard's
    /// weights and config (`crate::parallel::ShardSpec::config`), `kv` its KV heads, and every
    /// rank of `tp.comm`'s group runs this with the same `plan` at the same time. The partial
    /// `att·Wo` and `·Wdown` are summed over the ranks before each residual add (the row-split
    /// biases are in rank 0's weights only); `s.logits` gets this rank's vocabulary slice
    /// (`[n_logits, n_vocab_shard]`) and rank 0's `tp.logits` all of them (`[n_logits, n_vocab]`).
    ///
    /// Errors: as [`Self::forward`], and the communicator's (an aborted group).
    pub fn forward_tp(
        &self,
        kv: &mut B::KvCache,
        s: &mut Scratch<B>,
        plan: &BatchPlan,
        mut tp: Option<TensorParallel<'_, B>>,
    ) -> Result<usize> {
        let n = plan.n_tokens();
        let n_logits = plan.logit_rows.len();
        if n == 0 {
            return Ok(0);
        }
        if n > s.max_tokens || n_logits > s.max_logits {
            return Err(FakError::invalid(
                "batch",
                format!(
                    "{n} tokens / {n_logits} logit rows exceed the forward limits {} / {}",
                    s.max_tokens, s.max_logits
                ),
            ));
        }
        let c = &self.config;
        let be = &self.backend;
        let w = &self.weights;
        be.set_batch(&mut s.batch, plan)?;
        // A layer whose experts run on the host breaks the step into host and device work: no graph.
        let decode_only = plan.seqs.iter().all(|q| q.n_rows == 1) && self.weights.host_expert_layers == 0;
        let key = decode_only.then_some(GraphKey {
            n_tokens: n,
            n_logits,
        });
        let attn = c.attn();
        let d = c.n_embd;
        let comm = tp.as_ref().map(|t| t.comm);
        let mut run = || -> Result<()> {
            let Scratch {
                x,
                h,
                q,
                k,
                v,
                att,
                att_l,
                tmp,
                gate,
                up,
                xl,
                logits,
                batch,
                moe,
                hybrid,
                ..
            } = &mut *s;
            let mut moe = moe.as_mut();
            let mut hybrid = hybrid.as_mut();
            let batch = &*batch;
            be.embed(&w.token_embd, batch, n, x)?;
            let mut pruned = false;
            for (il, lw) in w.layers.iter().enumerate() {
                be.rmsnorm(x, &lw.attn_norm, c.rms_eps, n, d, h)?;
                // The mixer: attention (`att` = its output before Wo, `q_dim` wide) or a Gated
                // DeltaNet (`att` = its projected output, `n_embd` wide).
                let aw = match &lw.mixer {
                    Mixer::Attention(a) => {
                        let qk_norm = a.q_norm.as_ref().zip(a.k_norm.as_ref()).map(|(qn, kn)| (qn, kn, c.rms_eps));
                        match (a.gated, hybrid.as_deref_mut()) {
                            (false, _) => {
                                be.matmul_multi(
                                    &[(&a.wq, a.bq.as_ref()), (&a.wk, a.bk.as_ref()), (&a.wv, a.bv.as_ref())],
                                    h,
                                    n,
                                    &mut [&mut *q, &mut *k, &mut *v],
                                )?;
                            }
                            (true, Some(hs)) => {
                                be.matmul_multi(
                                    &[(&a.wq, a.bq.as_ref()), (&a.wk, a.bk.as_ref()), (&a.wv, a.bv.as_ref())],
                                    h,
                                    n,
                                    &mut [&mut hs.qg, &mut *k, &mut *v],
                                )?;
                                be.split_q_gate(&hs.qg, n, c.n_head, c.head_dim, q, &mut hs.gate)?;
                            }
                            (true, None) => return Err(FakError::model("gated attention without its scratch buffers")),
                        }
                        be.rope_kv_write(q, k, v, kv, il, batch, n, &attn, &c.rope, w.rope_freqs.as_ref(), qk_norm)?;
                        be.attention(q, kv, il, batch, n, &c.layer_attn(il), att)?;
                        if let (true, Some(hs)) = (a.gated, hybrid.as_deref()) {
                            be.mul_sigmoid(att, &hs.gate, n * c.q_dim())?;
                        }
                        c.q_dim()
                    }
                    Mixer::DeltaNet(dn) => {
                        let hy = c.hybrid.as_ref().ok_or_else(|| FakError::model("a Gated DeltaNet layer in a model without hybrid hyper-parameters"))?;
                        let dw = DeltaNetWeights { qkv: &dn.qkv, gate: &dn.gate, beta: &dn.beta, alpha: &dn.alpha, conv: &dn.conv, dt_bias: &dn.dt_bias, a: &dn.a, norm: &dn.norm, out: &dn.out };
                        let p = DeltaNetParams { n_embd: d, d_conv: hy.d_conv, d_state: hy.d_state, n_k_heads: hy.n_k_heads, n_v_heads: hy.n_v_heads, state_layer: dn.state_layer, eps: c.rms_eps };
                        be.delta_net(&dw, &p, h, kv, batch, n, att)?;
                        d
                    }
                };
                // The hybrids run their last layer on every row and keep only the rows that need
                // logits after the output norm (llama.cpp qwen35: `embeddings_nextn_masked` off).
                if il + 1 == w.layers.len() && n_logits < n && !c.arch.is_hybrid() {
                    // Last layer: only the rows that need logits go on (llama.cpp `inp_out_ids`);
                    // every row's K/V is already in the cache.
                    pruned = true;
                    if n_logits > 0 {
                        be.gather_logit_rows(att, batch, aw, att_l)?;
                        be.gather_logit_rows(x, batch, d, xl)?;
                        block_tail(be, lw, c, n_logits, xl, att_l, h, tmp, gate, up, moe.as_deref_mut(), comm)?;
                    }
                } else {
                    block_tail(be, lw, c, n, x, att, h, tmp, gate, up, moe.as_deref_mut(), comm)?;
                }
            }
            if n_logits > 0 {
                if !pruned {
                    be.gather_logit_rows(x, batch, d, xl)?;
                }
                be.rmsnorm(xl, &w.output_norm, c.rms_eps, n_logits, d, h)?;
                be.matmul(w.lm_head(), None, h, n_logits, logits)?;
                if let Some(tp) = tp.as_mut() {
                    tp.comm.gather_cols(be, logits, n_logits, c.n_vocab, tp.logits.as_deref_mut())?;
                }
            }
            Ok(())
        };
        be.run_forward(key, &mut run)?;
        Ok(n_logits)
    }
}

/// The rest of a transformer block after attention, on `n` rows: `x += att·Wo (+bo)`, then
/// `x += (silu(h·Wgate) ⊙ h·Wup)·Wdown` with `h = rmsnorm(x)·w_ffn_norm` (or the MoE FFN). With
/// `comm` (a tensor-parallel shard) each projection (the MoE FFN's weighted sum of experts) is
/// this shard's partial sum, all-reduced over the shards before its residual add.
#[allow(clippy::too_many_arguments)]
fn block_tail<B: Backend>(
    be: &B,
    lw: &LayerWeights<B>,
    c: &ModelConfig,
    n: usize,
    x: &mut B::Buffer,
    att: &B::Buffer,
    h: &mut B::Buffer,
    tmp: &mut B::Buffer,
    gate: &mut B::Buffer,
    up: &mut B::Buffer,
    moe: Option<&mut MoeScratch<B>>,
    comm: Option<&dyn Communicator<B>>,
) -> Result<()> {
    let d = c.n_embd;
    match &lw.mixer {
        Mixer::Attention(a) => residual_proj(be, &a.wo, a.bo.as_ref(), att, n, d, tmp, x, comm)?,
        // The Gated DeltaNet's output is projected already (its `W_out`).
        Mixer::DeltaNet(_) if comm.is_none() => be.add(x, att, n * d)?,
        Mixer::DeltaNet(_) => return Err(FakError::Unsupported("tensor parallelism of a Gated DeltaNet layer".into())),
    }
    be.rmsnorm(x, &lw.ffn_norm, c.rms_eps, n, d, h)?;
    match (&lw.ffn, moe, c.moe) {
        (Ffn::Dense { w_gate, w_up, w_down }, _, _) => {
            be.matmul_multi(&[(w_gate, None), (w_up, None)], h, n, &mut [&mut *gate, &mut *up])?;
            be.swiglu(gate, up, n * c.n_ff)?;
            residual_proj(be, w_down, None, gate, n, d, tmp, x, comm)
        }
        (Ffn::Moe { gate_inp, gate_exps, up_exps, down_exps, shared: Some(sh) }, Some(ms), Some(m)) => {
            if comm.is_some() {
                return Err(FakError::Unsupported("tensor parallelism of a MoE layer with a shared expert".into()));
            }
            // llama.cpp qwen35moe: (moe_out + shexp(h)·sigmoid(h·g)) + residual. moe_out lands in
            // zeros (exact), the shared expert in the experts buffer, free once moe_ffn is done.
            let w = MoeWeights { gate_inp, gate_exps, up_exps, down_exps };
            let p = MoeParams { n_embd: d, n_expert: m.n_expert, k: m.n_expert_used, n_ff_exp: m.n_ff_exp, norm_w: m.norm_w, w_scale: m.w_scale };
            be.zero(tmp, n * d)?;
            let bufs = MoeBuffers { router: &mut ms.router, ids: &mut ms.ids, weights: &mut ms.weights, gate, up, experts: &mut ms.experts };
            be.moe_ffn(h, &w, &p, n, bufs, tmp)?;
            be.matmul_multi(&[(&sh.gate, None), (&sh.up, None)], h, n, &mut [&mut *gate, &mut *up])?;
            be.swiglu(gate, up, n * m.n_ff_shexp)?;
            be.matmul(&sh.down, None, gate, n, &mut ms.experts)?;
            be.matmul(&sh.gate_inp, None, h, n, &mut ms.router)?;
            be.mul_rows_sigmoid(&mut ms.experts, &ms.router, n, d)?;
            be.add(tmp, &ms.experts, n * d)?;
            be.add(x, tmp, n * d)
        }
        (Ffn::Moe { gate_inp, gate_exps, up_exps, down_exps, shared: None }, Some(ms), Some(m)) => {
            let w = MoeWeights { gate_inp, gate_exps, up_exps, down_exps };
            let p = MoeParams { n_embd: d, n_expert: m.n_expert, k: m.n_expert_used, n_ff_exp: m.n_ff_exp, norm_w: m.norm_w, w_scale: m.w_scale };
            let bufs = MoeBuffers { router: &mut ms.router, ids: &mut ms.ids, weights: &mut ms.weights, gate, up, experts: &mut ms.experts };
            let divided = m.held != (0, m.n_expert);
            match comm {
                None if !divided => be.moe_ffn(h, &w, &p, n, bufs, x),
                None => Err(FakError::model("a MoE layer holding some of its experts outside tensor parallelism")),
                Some(comm) => {
                    // Every shard routes the same (replicated router, identical h). Its weighted sum
                    // covers its experts (or its columns of every expert): a partial one, summed
                    // into zeros, all-reduced, then added to the residual.
                    be.zero(tmp, n * d)?;
                    if divided {
                        moe_ffn_held(be, h, &w, &p, m.held, n, bufs, tmp)?;
                    } else {
                        be.moe_ffn(h, &w, &p, n, bufs, tmp)?;
                    }
                    comm.all_reduce_sum(be, tmp, n * d)?;
                    be.add(x, tmp, n * d)
                }
            }
        }
        (Ffn::Moe { .. }, _, _) => Err(FakError::model("a mixture-of-experts layer without its scratch buffers")),
    }
}

/// [`Backend::moe_ffn`]'s ops for a tensor-parallel shard that holds experts `[e0, e1)` of the
/// layer's `n_expert` (`w`'s stacks hold only those): the whole routing, then only the chosen pairs
/// among its experts ([`Backend::moe_localize`]), their weighted sum added to `res`.
#[allow(clippy::too_many_arguments)]
fn moe_ffn_held<B: Backend>(
    be: &B,
    h: &B::Buffer,
    w: &MoeWeights<'_, B::Weight>,
    p: &MoeParams,
    (e0, e1): (usize, usize),
    n: usize,
    s: MoeBuffers<'_, B::Buffer>,
    res: &mut B::Buffer,
) -> Result<()> {
    let k = p.k;
    be.matmul(w.gate_inp, None, h, n, s.router)?;
    be.moe_route(s.router, n, p.n_expert, k, p.norm_w, p.w_scale, s.ids, s.weights)?;
    be.moe_localize(s.ids, s.weights, n * k, e0, e1)?;
    be.matmul_id(w.up_exps, h, s.ids, n, k, false, s.up)?;
    be.matmul_id(w.gate_exps, h, s.ids, n, k, false, s.gate)?;
    be.swiglu(s.gate, s.up, n * k * p.n_ff_exp)?;
    be.matmul_id(w.down_exps, s.gate, s.ids, n, k, true, s.experts)?;
    be.moe_combine(s.experts, s.weights, n, k, p.n_embd, res)
}

/// `x += inp·Wᵀ (+bias)` on `n` rows of `d` outputs; with `comm`, `inp·Wᵀ (+bias)` is this
/// shard's partial sum (`W` its K slice), summed over the shards into `tmp` before the add.
#[allow(clippy::too_many_arguments)]
fn residual_proj<B: Backend>(
    be: &B,
    w: &B::Weight,
    bias: Option<&B::Weight>,
    inp: &B::Buffer,
    n: usize,
    d: usize,
    tmp: &mut B::Buffer,
    x: &mut B::Buffer,
    comm: Option<&dyn Communicator<B>>,
) -> Result<()> {
    match comm {
        None => be.matmul_add(w, bias, inp, n, d, tmp, x),
        Some(comm) => {
            be.matmul(w, bias, inp, n, tmp)?;
            comm.all_reduce_sum(be, tmp, n * d)?;
            be.add(x, tmp, n * d)
        }
    }
}
