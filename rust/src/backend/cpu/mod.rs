//! The CPU backend: the reference implementation of every op of the forward pass. Quantized
//! matmul with run-time chosen SIMD lives in `matmul`; the other ops (RMSNorm, RoPE, attention
//! over the paged f16 KV cache, SwiGLU, residual add, embedding gather) are here, one file per
//! family. Everything runs on the rayon pool the caller installs (the model's pool).

pub mod attention;
pub mod deltanet;
pub mod kv;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod stdsort;
pub mod vecops;
pub mod weight;

use std::sync::Mutex;

use rayon::prelude::*;

pub use kv::CpuKvCache;
pub use weight::CpuWeight;

use crate::backend::{
    AttnParams, Backend, BatchLimits, BatchPlan, HostTensor, KvLayout, RopeParams,
};
use crate::{FakError, Result};

/// The CPU backend. Its only state is which rows of the current batch llama.cpp would compute
/// in which of its matmul kernels ([`GemmRows`]); the thread pool is the caller's.
#[derive(Debug, Default)]
pub struct CpuBackend {
    gemm_rows: Mutex<GemmRows>,
}

/// llama.cpp's ubatch size in the configuration fak reproduces (the goldens': `n_batch` =
/// `n_ubatch` = 512). A prompt is evaluated in ubatches of this many tokens, a generated token
/// in a one-row ubatch.
pub const LLAMA_UBATCH: u32 = 512;

/// The llama.cpp ubatch of the token at position `pos` of a sequence whose prompt has
/// `n_prompt` tokens: `(rows in the ubatch, the token's index in it)`. Several of llama.cpp's CPU
/// kernels depend on these (see [`matmul::LlamaRow`] and the attention's `Chains`), so fak derives
/// them per token — independent of how fak itself batches or chunks the rows.
pub fn llama_ubatch(pos: u32, n_prompt: u32) -> (u32, u32) {
    if pos >= n_prompt {
        return (1, 0);
    }
    let u0 = pos / LLAMA_UBATCH * LLAMA_UBATCH;
    ((n_prompt - u0).min(LLAMA_UBATCH), pos - u0)
}

/// The kind of llama.cpp matmul kernel of the token at `pos` ([`llama_ubatch`]): of a ubatch's
/// `n` rows the first `n − n mod 4` go through the repacked-Q4_K GEMM, the rest its GEMV; with
/// `n ≥ 8`, Q6_K goes through the tiled kernel.
pub fn llama_row(pos: u32, n_prompt: u32) -> matmul::LlamaRow {
    let (n, i) = llama_ubatch(pos, n_prompt);
    matmul::LlamaRow { gemm4: i < n - n % 4, tiled: n >= 8, single: n == 1 }
}

/// The [`matmul::LlamaRow`] of each row of the current batch (`all`) and of its logit rows
/// (`logits`: the rows of the last layer after llama.cpp's `inp_out_ids` pruning, one output row
/// per ubatch, so GEMV kernels), and each row's llama.cpp ubatch (`groups`, `logit_groups`: rows
/// with the same number were in one ubatch of one sequence there; a generated token is a ubatch
/// of its own), which the MoE expert matmul needs (see [`moe`]).
#[derive(Debug, Default)]
struct GemmRows {
    all: Vec<matmul::LlamaRow>,
    logits: Vec<matmul::LlamaRow>,
    groups: Vec<u32>,
    logit_groups: Vec<u32>,
}

impl GemmRows {
    fn set(&mut self, plan: &BatchPlan) {
        self.all.clear();
        self.groups.clear();
        let mut next = 0u32;
        for s in &plan.seqs {
            self.all.extend((0..s.n_rows).map(|i| llama_row(s.n_past + i, s.n_prompt)));
            let mut last: Option<u32> = None;
            for i in 0..s.n_rows {
                let pos = s.n_past + i;
                let g = if pos < s.n_prompt {
                    let u = pos / LLAMA_UBATCH;
                    if last != Some(u) {
                        next += 1;
                        last = Some(u);
                    }
                    next
                } else {
                    last = None;
                    next += 1;
                    next
                };
                self.groups.push(g);
            }
        }
        self.logits.clear();
        self.logits.resize(plan.logit_rows.len(), matmul::LlamaRow { single: true, ..Default::default() });
        self.logit_groups.clear();
        self.logit_groups.extend((0..plan.logit_rows.len() as u32).map(|j| next + 1 + j));
    }

    /// The row kinds for a matmul over `n_rows` rows: the batch's rows or its logit rows.
    fn for_rows(&self, n_rows: usize) -> Option<&[matmul::LlamaRow]> {
        if n_rows == self.all.len() {
            Some(&self.all)
        } else if n_rows == self.logits.len() {
            Some(&self.logits)
        } else {
            None
        }
    }

    /// The llama.cpp ubatch of each of `n_rows` rows (as [`Self::for_rows`]); `None` for a
    /// matmul outside a forward (each row its own).
    fn groups_for_rows(&self, n_rows: usize) -> Option<&[u32]> {
        if n_rows == self.groups.len() {
            Some(&self.groups)
        } else if n_rows == self.logit_groups.len() {
            Some(&self.logit_groups)
        } else {
            None
        }
    }
}

/// An f32 activation buffer.
#[derive(Debug, Clone)]
pub struct CpuBuffer(pub Vec<f32>);

/// A batch on the CPU: the plan itself, plus the RoPE `cos`/`sin` table of its positions,
/// computed on first use and shared by every layer.
pub struct CpuBatch {
    pub plan: BatchPlan,
    rope_table: Mutex<Option<RopeTable>>,
}

struct RopeTable {
    params: RopeParams,
    freq_factors: usize,
    table: std::sync::Arc<Vec<f32>>,
}

impl CpuBatch {
    fn rope_table(
        &self,
        rope: &RopeParams,
        freq_factors: Option<&[f32]>,
    ) -> std::sync::Arc<Vec<f32>> {
        let key = freq_factors.map_or(0, |f| f.as_ptr() as usize);
        let mut slot = self.rope_table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = slot.as_ref() {
            if t.params == *rope && t.freq_factors == key {
                return t.table.clone();
            }
        }
        let table = std::sync::Arc::new(rope::cos_sin_table(
            &self.plan.positions,
            rope,
            freq_factors,
        ));
        *slot = Some(RopeTable {
            params: *rope,
            freq_factors: key,
            table: table.clone(),
        });
        table
    }
}

/// A zero-filled vector of `n` elements whose pages are committed lazily (`alloc_zeroed`, i.e.
/// calloc: fresh mappings are already zero), or an error instead of an abort when the allocation
/// fails. `T` must be a plain number type whose all-zero bit pattern is zero.
pub fn zeroed_vec<T: Copy + Default>(n: usize, what: &str) -> Result<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| oom(what, usize::MAX))?;
    if layout.size() == 0 {
        return Ok(vec![T::default(); n]);
    }
    // SAFETY: the layout has a non-zero size; a non-null result is a fresh zeroed allocation of
    // `n` `T`s with `T`'s alignment from the global allocator, which is what `Vec` frees, and
    // all-zero bytes are a valid `T` (plain numbers, see above).
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return Err(oom(what, layout.size()));
        }
        Ok(Vec::from_raw_parts(p, n, n))
    }
}

fn oom(what: &str, bytes: usize) -> FakError {
    FakError::Backend { backend: "cpu".into(), msg: format!("out of memory allocating {what} ({bytes} bytes); lower n_ctx, max_batch or kv_cache_tokens") }
}

fn f32_of(w: &CpuWeight) -> Result<&[f32]> {
    w.as_f32()
        .ok_or_else(|| FakError::model(format!("tensor {} must be a 1-D vector", w.name)))
}

impl Backend for CpuBackend {
    type Weight = CpuWeight;
    type Buffer = CpuBuffer;
    type KvCache = CpuKvCache;
    type Batch = CpuBatch;
    type HostBuf = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn load_weight(&self, t: &HostTensor<'_>) -> Result<CpuWeight> {
        CpuWeight::from_host(t)
    }

    fn alloc_buffer(&self, n: usize) -> Result<CpuBuffer> {
        Ok(CpuBuffer(zeroed_vec(n, "an activation buffer")?))
    }

    fn alloc_kv_cache(&self, layout: KvLayout) -> Result<CpuKvCache> {
        CpuKvCache::new(layout)
    }

    fn alloc_batch(&self, limits: BatchLimits) -> Result<CpuBatch> {
        let mut plan = BatchPlan::default();
        plan.tokens.reserve(limits.max_tokens);
        plan.positions.reserve(limits.max_tokens);
        plan.slots.reserve(limits.max_tokens);
        plan.seqs.reserve(limits.max_seqs);
        Ok(CpuBatch {
            plan,
            rope_table: Mutex::new(None),
        })
    }

    fn set_batch(&self, batch: &mut CpuBatch, plan: &BatchPlan) -> Result<()> {
        self.gemm_rows.lock().unwrap_or_else(|e| e.into_inner()).set(plan);
        batch.plan.clone_from(plan);
        *batch
            .rope_table
            .get_mut()
            .unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    fn embed(
        &self,
        table: &CpuWeight,
        batch: &CpuBatch,
        n_tokens: usize,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        let dim = table.k();
        let n_vocab = table.n_out();
        let rb = table.row_bytes();
        let bytes = table.bytes();
        let tokens = &batch.plan.tokens[..n_tokens];
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(FakError::invalid(
                "token_ids",
                format!("token id {bad} is out of range for a vocabulary of {n_vocab}"),
            ));
        }
        let one = |(o, &t): (&mut [f32], &u32)| {
            crate::quant::dequantize_row(table.wtype, &bytes[t as usize * rb..][..rb], o)
        };
        let out = &mut out.0[..n_tokens * dim];
        if n_tokens >= 32 {
            out.par_chunks_mut(dim)
                .zip(tokens.par_iter())
                .try_for_each(one)
        } else {
            out.chunks_mut(dim).zip(tokens.iter()).try_for_each(one)
        }
    }

    fn rmsnorm(
        &self,
        x: &CpuBuffer,
        w: &CpuWeight,
        eps: f32,
        n_rows: usize,
        dim: usize,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        let w = f32_of(w)?;
        debug_assert_eq!(w.len(), dim);
        norm::rmsnorm(&x.0, w, eps, n_rows, &mut out.0);
        Ok(())
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        x: &CpuBuffer,
        n_rows: usize,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        let (k, n_out) = (w.k(), w.n_out());
        let y = &mut out.0[..n_rows * n_out];
        let x = &x.0[..n_rows * k];
        if matches!(w.wtype, crate::quant::GgmlType::Q4_K | crate::quant::GgmlType::Q6_K | crate::quant::GgmlType::F32) {
            // A copy of the row kinds, so that the lock is not held across the parallel matmul:
            // a pool thread waiting in it may steal another matmul of the same `matmul_multi`,
            // which would take the lock again on the same thread (a deadlock, seen with ≥ 8
            // threads on the 1.5B twin).
            let kinds = self
                .gemm_rows
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .for_rows(n_rows)
                .map(<[matmul::LlamaRow]>::to_vec);
            match kinds.as_deref() {
                Some(kinds) => matmul::matmul_rows(w.wtype, w.bytes(), n_out, k, x, n_rows, y, kinds)?,
                None => matmul::matmul(w.wtype, w.bytes(), n_out, k, x, n_rows, y)?,
            }
        } else {
            matmul::matmul(w.wtype, w.bytes(), n_out, k, x, n_rows, y)?;
        }
        if let Some(b) = bias {
            let b = f32_of(b)?;
            for row in y.chunks_exact_mut(n_out) {
                for (v, &bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
        }
        Ok(())
    }

    fn matmul_multi(
        &self,
        ws: &[(&CpuWeight, Option<&CpuWeight>)],
        x: &CpuBuffer,
        n_rows: usize,
        outs: &mut [&mut CpuBuffer],
    ) -> Result<()> {
        debug_assert_eq!(ws.len(), outs.len());
        outs.par_iter_mut()
            .zip(ws.par_iter())
            .try_for_each(|(out, (w, b))| self.matmul(w, *b, x, n_rows, out))
    }

    fn rope(
        &self,
        x: &mut CpuBuffer,
        batch: &CpuBatch,
        n_rows: usize,
        n_heads: usize,
        head_dim: usize,
        rope: &RopeParams,
        freq_factors: Option<&CpuWeight>,
    ) -> Result<()> {
        let ff = freq_factors.map(f32_of).transpose()?;
        let table = batch.rope_table(rope, ff);
        rope::apply(&mut x.0, &table, n_rows, n_heads, head_dim, rope);
        Ok(())
    }

    fn kv_write(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &CpuBuffer,
        v: &CpuBuffer,
        batch: &CpuBatch,
        n_rows: usize,
    ) -> Result<()> {
        cache.write(layer, &k.0, &v.0, &batch.plan, n_rows);
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuBuffer,
        cache: &CpuKvCache,
        layer: usize,
        batch: &CpuBatch,
        n_rows: usize,
        params: &AttnParams,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        attention::attention(&q.0, cache, layer, &batch.plan, n_rows, params, &mut out.0);
        Ok(())
    }

    fn swiglu(&self, gate: &mut CpuBuffer, up: &CpuBuffer, n: usize) -> Result<()> {
        const CHUNK: usize = 1 << 14;
        let (g, u) = (&mut gate.0[..n], &up.0[..n]);
        if n >= 2 * CHUNK {
            g.par_chunks_mut(CHUNK)
                .zip(u.par_chunks(CHUNK))
                .for_each(|(g, u)| vecops::swiglu(g, u));
        } else {
            vecops::swiglu(g, u);
        }
        Ok(())
    }

    fn rmsnorm_inplace(&self, x: &mut CpuBuffer, w: &CpuWeight, eps: f32, n_rows: usize, dim: usize) -> Result<()> {
        let w = f32_of(w)?;
        debug_assert_eq!(w.len(), dim);
        norm::rmsnorm_inplace(&mut x.0, w, eps, n_rows);
        Ok(())
    }

    fn moe_route(
        &self,
        logits: &CpuBuffer,
        n_rows: usize,
        n_expert: usize,
        k: usize,
        norm_w: bool,
        w_scale: f32,
        ids: &mut CpuBuffer,
        weights: &mut CpuBuffer,
    ) -> Result<()> {
        moe::route(&logits.0, n_rows, n_expert, k, norm_w, w_scale, &mut ids.0, &mut weights.0);
        Ok(())
    }

    fn matmul_id(&self, w: &CpuWeight, x: &CpuBuffer, ids: &CpuBuffer, n_rows: usize, k: usize, x_per_pair: bool, out: &mut CpuBuffer) -> Result<()> {
        if w.dims.len() != 3 {
            return Err(FakError::model(format!("tensor {} is not a stack of expert matrices", w.name)));
        }
        let (k_in, n_out, n_expert) = (w.dims[0], w.dims[1], w.dims[2]);
        let n_x = if x_per_pair { n_rows * k } else { n_rows };
        let groups = self
            .gemm_rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .groups_for_rows(n_rows)
            .map(<[u32]>::to_vec);
        let m = moe::ExpertMatmul { wtype: w.wtype, w: w.bytes(), k_in, n_out, n_expert };
        m.run(&x.0[..n_x * k_in], x_per_pair, &ids.0[..n_rows * k], k, groups.as_deref(), &mut out.0[..n_rows * k * n_out])
    }

    fn delta_net(
        &self,
        w: &crate::backend::DeltaNetWeights<'_, CpuWeight>,
        p: &crate::backend::DeltaNetParams,
        h: &CpuBuffer,
        cache: &mut CpuKvCache,
        batch: &CpuBatch,
        n_rows: usize,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        deltanet::delta_net(self, w, p, h, cache, batch, n_rows, out)
    }

    fn split_q_gate(&self, qg: &CpuBuffer, n_rows: usize, n_head: usize, head_dim: usize, q: &mut CpuBuffer, gate: &mut CpuBuffer) -> Result<()> {
        deltanet::split_q_gate(&qg.0, n_rows, n_head, head_dim, &mut q.0, &mut gate.0);
        Ok(())
    }

    fn copy_state(&self, cache: &mut CpuKvCache, from: usize, to: usize) -> Result<()> {
        cache.copy_state(from, to);
        Ok(())
    }

    fn mul_rows_sigmoid(&self, x: &mut CpuBuffer, g: &CpuBuffer, n_rows: usize, dim: usize) -> Result<()> {
        for (row, &gv) in x.0.chunks_mut(dim).zip(&g.0).take(n_rows) {
            let s = vecops::sigmoid(gv);
            row.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }

    fn mul_sigmoid(&self, x: &mut CpuBuffer, gate: &CpuBuffer, n: usize) -> Result<()> {
        deltanet::mul_sigmoid(&mut x.0[..n], &gate.0[..n]);
        Ok(())
    }

    fn moe_combine(&self, experts: &CpuBuffer, weights: &CpuBuffer, n_rows: usize, k: usize, dim: usize, res: &mut CpuBuffer) -> Result<()> {
        moe::combine(&experts.0, &weights.0, n_rows, k, dim, &mut res.0);
        Ok(())
    }

    fn moe_localize(&self, ids: &mut CpuBuffer, weights: &mut CpuBuffer, n_pairs: usize, e0: usize, e1: usize) -> Result<()> {
        moe::localize(&mut ids.0[..n_pairs], &mut weights.0[..n_pairs], e0, e1);
        Ok(())
    }

    fn zero(&self, x: &mut CpuBuffer, n: usize) -> Result<()> {
        x.0[..n].fill(0.0);
        Ok(())
    }

    fn add(&self, x: &mut CpuBuffer, y: &CpuBuffer, n: usize) -> Result<()> {
        const CHUNK: usize = 1 << 15;
        let add = |(a, b): (&mut [f32], &[f32])| {
            for (a, &b) in a.iter_mut().zip(b) {
                *a += b;
            }
        };
        let (a, b) = (&mut x.0[..n], &y.0[..n]);
        if n >= 2 * CHUNK {
            a.par_chunks_mut(CHUNK)
                .zip(b.par_chunks(CHUNK))
                .for_each(add);
        } else {
            add((a, b));
        }
        Ok(())
    }

    fn gather_logit_rows(
        &self,
        x: &CpuBuffer,
        batch: &CpuBatch,
        dim: usize,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        for (j, &r) in batch.plan.logit_rows.iter().enumerate() {
            let r = r as usize;
            out.0[j * dim..(j + 1) * dim].copy_from_slice(&x.0[r * dim..(r + 1) * dim]);
        }
        Ok(())
    }

    fn read_f32(&self, buf: &CpuBuffer, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&buf.0[..out.len()]);
        Ok(())
    }

    fn host_buffer(&self, n: usize) -> Result<Vec<f32>> {
        zeroed_vec(n, "the host logits buffer")
    }

    fn greedy_rows(
        &self,
        x: &CpuBuffer,
        n_rows: usize,
        n_cols: usize,
        tokens: &mut [u32],
        logprobs: &mut [f32],
    ) -> Result<()> {
        let rows = &x.0[..n_rows * n_cols];
        let one = |((row, t), lp): ((&[f32], &mut u32), &mut f32)| {
            (*t, *lp) = crate::backend::greedy_row(row);
        };
        if n_rows > 1 {
            rows.par_chunks(n_cols)
                .zip(tokens.par_iter_mut())
                .zip(logprobs.par_iter_mut())
                .for_each(one);
        } else {
            rows.chunks(n_cols)
                .zip(tokens.iter_mut())
                .zip(logprobs.iter_mut())
                .for_each(one);
        }
        Ok(())
    }

    fn penalize_rows(
        &self,
        x: &mut CpuBuffer,
        n_cols: usize,
        pens: &[crate::backend::LogitPenalty],
        raw: &mut [f32],
    ) -> Result<()> {
        for (p, r) in pens.iter().zip(raw.iter_mut()) {
            let v = &mut x.0[p.row as usize * n_cols + p.token as usize];
            *r = *v;
            *v = p.apply(*v);
        }
        Ok(())
    }

    fn read_row_f32(&self, x: &CpuBuffer, row: usize, n_cols: usize, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&x.0[row * n_cols..(row + 1) * n_cols]);
        Ok(())
    }

    fn argmax_rows(
        &self,
        x: &CpuBuffer,
        n_rows: usize,
        n_cols: usize,
        out: &mut [u32],
    ) -> Result<()> {
        for (r, o) in out.iter_mut().enumerate().take(n_rows) {
            *o = argmax(&x.0[r * n_cols..(r + 1) * n_cols]) as u32;
        }
        Ok(())
    }
}

/// Index of the largest value (the first one on ties; NaN never wins).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_first_of_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.25]), 1);
    }
}
