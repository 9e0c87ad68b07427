//! The forward pass of a pre-norm decoder-only transformer (Llama / Qwen2 family), written once
//! against the [`Backend`] trait:
//!
//! ```text
//! x = embed(tokens)
//! per block:  h = rmsnorm(x)·w_attn_norm
//!             q, k, v = h·Wq (+bq), h·Wk (+bk), h·Wv (+bv);  rope(q), rope(k)
//!             kv_write(k, v);  x += attention(q, KV cache)·Wo (+bo)
//!             h = rmsnorm(x)·w_ffn_norm;  x += (silu(h·Wgate) ⊙ h·Wup)·Wdown
//! logits = rmsnorm(x[logit rows])·w_out_norm · W_out
//! ```
//!
//! (llama.cpp `build_llama` / `build_qwen2`.) Only the rows that need logits go through the final
//! norm and the LM head, as llama.cpp's `inp_out_ids`.

use super::Model;
use crate::backend::{Backend, BatchLimits, BatchPlan, GraphKey};
use crate::{FakError, Result};

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
    tmp: B::Buffer,
    gate: B::Buffer,
    up: B::Buffer,
    xl: B::Buffer,
    /// `[max_logits, n_vocab]` logits of the last forward.
    pub logits: B::Buffer,
    batch: B::Batch,
}

impl<B: Backend> Scratch<B> {
    /// Buffers for up to `limits.max_tokens` rows and `max_logits` logit rows.
    pub fn new(model: &Model<B>, limits: BatchLimits, max_logits: usize) -> Result<Scratch<B>> {
        let c = &model.config;
        let b = &model.backend;
        let t = limits.max_tokens;
        let wide = c.n_embd.max(c.q_dim());
        Ok(Scratch {
            max_tokens: t,
            max_logits,
            x: b.alloc_buffer(t * c.n_embd)?,
            h: b.alloc_buffer(t * wide)?,
            q: b.alloc_buffer(t * c.q_dim())?,
            k: b.alloc_buffer(t * c.kv_dim())?,
            v: b.alloc_buffer(t * c.kv_dim())?,
            att: b.alloc_buffer(t * c.q_dim())?,
            tmp: b.alloc_buffer(t * c.n_embd)?,
            gate: b.alloc_buffer(t * c.n_ff)?,
            up: b.alloc_buffer(t * c.n_ff)?,
            xl: b.alloc_buffer(max_logits * c.n_embd)?,
            logits: b.alloc_buffer(max_logits * c.n_vocab)?,
            batch: b.alloc_batch(limits)?,
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
        let n = plan.n_tokens();
        let n_logits = plan.logit_rows.len();
        if n == 0 {
            return Ok(0);
        }
        if n > s.max_tokens || n_logits > s.max_logits {
            return Err(FakError::invalid(
                "batch",
                format!("{n} tokens / {n_logits} logit rows exceed the forward limits {} / {}", s.max_tokens, s.max_logits),
            ));
        }
        let c = &self.config;
        let be = &self.backend;
        let w = &self.weights;
        be.set_batch(&mut s.batch, plan)?;
        let decode_only = plan.seqs.iter().all(|q| q.n_rows == 1);
        let key = decode_only.then_some(GraphKey { n_tokens: n, n_logits });
        let attn = c.attn();
        let (d, ff) = (c.n_embd, c.n_ff);
        let mut run = || -> Result<()> {
            be.embed(&w.token_embd, &s.batch, n, &mut s.x)?;
            for (il, lw) in w.layers.iter().enumerate() {
                be.rmsnorm(&s.x, &lw.attn_norm, c.rms_eps, n, d, &mut s.h)?;
                be.matmul(&lw.wq, lw.bq.as_ref(), &s.h, n, &mut s.q)?;
                be.matmul(&lw.wk, lw.bk.as_ref(), &s.h, n, &mut s.k)?;
                be.matmul(&lw.wv, lw.bv.as_ref(), &s.h, n, &mut s.v)?;
                be.rope(&mut s.q, &s.batch, n, c.n_head, c.head_dim, &c.rope, w.rope_freqs.as_ref())?;
                be.rope(&mut s.k, &s.batch, n, c.n_head_kv, c.head_dim, &c.rope, w.rope_freqs.as_ref())?;
                be.kv_write(kv, il, &s.k, &s.v, &s.batch, n)?;
                be.attention(&s.q, kv, il, &s.batch, n, &attn, &mut s.att)?;
                be.matmul(&lw.wo, lw.bo.as_ref(), &s.att, n, &mut s.tmp)?;
                be.add(&mut s.x, &s.tmp, n * d)?;
                be.rmsnorm(&s.x, &lw.ffn_norm, c.rms_eps, n, d, &mut s.h)?;
                be.matmul(&lw.w_gate, None, &s.h, n, &mut s.gate)?;
                be.matmul(&lw.w_up, None, &s.h, n, &mut s.up)?;
                be.swiglu(&mut s.gate, &s.up, n * ff)?;
                be.matmul(&lw.w_down, None, &s.gate, n, &mut s.tmp)?;
                be.add(&mut s.x, &s.tmp, n * d)?;
            }
            if n_logits > 0 {
                be.gather_logit_rows(&s.x, &s.batch, d, &mut s.xl)?;
                be.rmsnorm(&s.xl, &w.output_norm, c.rms_eps, n_logits, d, &mut s.h)?;
                be.matmul(w.lm_head(), None, &s.h, n_logits, &mut s.logits)?;
            }
            Ok(())
        };
        be.run_forward(key, &mut run)?;
        Ok(n_logits)
    }
}
