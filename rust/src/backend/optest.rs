//! Single ops of any [`Backend`] on host data, for the op-by-op tests that compare the CUDA
//! backend with the CPU reference (`tests/cuda/test_ops.py`) through the same trait calls the
//! forward pass makes. Every output buffer is poisoned (NaN) before the op runs, so an element the
//! op fails to write shows up as NaN.
//!
//! Adding an op: a generic `pub fn op<B: TestIo>(b: &B, …)` here, one `OpRunner` method in
//! `rust/src/python/cuda.rs` that converts the arrays and calls it through `run!` (the one dispatch over
//! backends), its stub in `python/fak/_native.pyi`, and its cases under `tests/cuda/` (`test_ops.py`,
//! or the family's file: `test_sampling_ops.py`, `test_moe_cuda.py`, `test_hybrid_cuda.py`).

use std::any::Any;
use std::sync::Arc;

use super::cpu::{CpuBackend, CpuBuffer, CpuKvCache};
use super::{AttnParams, Backend, BatchLimits, BatchPlan, DeltaNetParams, DeltaNetWeights, HostTensor, KvLayout, LogitRows, MoeBuffers, MoeParams, MoeWeights, RopeParams};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Host I/O a backend offers to tests beyond the trait.
pub trait TestIo: Backend {
    /// A buffer holding `data`.
    fn upload(&self, data: &[f32]) -> Result<Self::Buffer>;
    /// Fills the first `n` elements with NaN.
    fn poison(&self, buf: &mut Self::Buffer, n: usize) -> Result<()>;
    /// `layer`'s K (or V) at `positions` of a sequence with `table`, `[n, n_head_kv, head_dim]`.
    fn read_kv(&self, cache: &Self::KvCache, layer: usize, values: bool, table: &[u32], positions: std::ops::Range<usize>) -> Result<Vec<f32>>;
    /// Writes the recurrent state of `slot` in state layer `layer` (`state_len` f32).
    fn write_state(&self, cache: &mut Self::KvCache, layer: usize, slot: usize, data: &[f32]) -> Result<()>;
    /// The recurrent state of `slot` in state layer `layer`.
    fn read_state(&self, cache: &Self::KvCache, layer: usize, slot: usize) -> Result<Vec<f32>>;
}

impl TestIo for CpuBackend {
    fn upload(&self, data: &[f32]) -> Result<CpuBuffer> {
        Ok(CpuBuffer(data.to_vec()))
    }
    fn poison(&self, buf: &mut CpuBuffer, n: usize) -> Result<()> {
        let n = n.min(buf.0.len());
        buf.0[..n].fill(f32::NAN);
        Ok(())
    }
    fn read_kv(&self, cache: &CpuKvCache, layer: usize, values: bool, table: &[u32], positions: std::ops::Range<usize>) -> Result<Vec<f32>> {
        Ok(cache.read_positions(layer, values, table, positions))
    }
    fn write_state(&self, cache: &mut CpuKvCache, layer: usize, slot: usize, data: &[f32]) -> Result<()> {
        cache.state_mut(layer, slot).copy_from_slice(data);
        Ok(())
    }
    fn read_state(&self, cache: &CpuKvCache, layer: usize, slot: usize) -> Result<Vec<f32>> {
        Ok(cache.state(layer, slot).to_vec())
    }
}

#[cfg(feature = "cuda")]
impl TestIo for super::cuda::CudaBackend {
    fn upload(&self, data: &[f32]) -> Result<super::cuda::CudaBuffer> {
        self.upload_buffer(data)
    }
    fn poison(&self, buf: &mut super::cuda::CudaBuffer, n: usize) -> Result<()> {
        self.fill(buf, f32::NAN, n)
    }
    fn read_kv(&self, cache: &super::cuda::CudaKvCache, layer: usize, values: bool, table: &[u32], positions: std::ops::Range<usize>) -> Result<Vec<f32>> {
        super::cuda::CudaBackend::read_kv(self, cache, layer, values, table, positions)
    }
    fn write_state(&self, cache: &mut super::cuda::CudaKvCache, layer: usize, slot: usize, data: &[f32]) -> Result<()> {
        cache.write_state(layer, slot, data)
    }
    fn read_state(&self, cache: &super::cuda::CudaKvCache, layer: usize, slot: usize) -> Result<Vec<f32>> {
        cache.read_state(layer, slot)
    }
}

fn weight<B: Backend>(b: &B, name: &str, wtype: GgmlType, dims: &[usize], data: Vec<u8>) -> Result<B::Weight> {
    let owner: Arc<Vec<u8>> = Arc::new(data);
    let t = HostTensor { name, wtype, dims, data: owner.as_slice(), owner: owner.clone() as Arc<dyn Any + Send + Sync> };
    b.load_weight(&t)
}

fn f32_weight<B: Backend>(b: &B, name: &str, v: &[f32]) -> Result<B::Weight> {
    weight(b, name, GgmlType::F32, &[v.len()], v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn read<B: Backend>(b: &B, buf: &B::Buffer, n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    b.read_f32(buf, &mut out)?;
    Ok(out)
}

fn out_buf<B: TestIo>(b: &B, n: usize) -> Result<B::Buffer> {
    let mut o = b.alloc_buffer(n)?;
    b.poison(&mut o, n)?;
    Ok(o)
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(FakError::invalid(what, format!("has {got} elements, expected {want}")));
    }
    Ok(())
}

/// A batch of one sequence of `n` rows at positions `n_past..` with blocks `0..` (enough for
/// the positions), for ops that only read positions/slots/tokens.
fn simple_plan(tokens: &[u32], positions: &[u32]) -> BatchPlan {
    let mut p = BatchPlan::default();
    p.tokens.extend_from_slice(tokens);
    p.positions.extend_from_slice(positions);
    p.slots.extend_from_slice(positions);
    p
}

fn limits_for(plan: &BatchPlan, max_blocks_per_seq: usize) -> BatchLimits {
    BatchLimits { max_tokens: plan.n_tokens().max(1), max_seqs: plan.seqs.len().max(1), max_blocks_per_seq: max_blocks_per_seq.max(1) }
}

/// `y = x · Wᵀ (+ bias)`: `w` is `n_out` rows of `k` values in `wtype` blocks, `x` `[n_rows, k]`.
pub fn matmul<B: TestIo>(b: &B, wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], bias: Option<&[f32]>) -> Result<Vec<f32>> {
    let n_rows = x.len() / k.max(1);
    check_len("x", x.len(), n_rows * k)?;
    let wt = weight(b, "w", wtype, &[k, n_out], w.to_vec())?;
    let bt = bias.map(|v| f32_weight(b, "bias", v)).transpose()?;
    let xb = b.upload(x)?;
    let mut out = out_buf(b, n_rows * n_out)?;
    b.matmul(&wt, bt.as_ref(), &xb, n_rows, &mut out)?;
    read(b, &out, n_rows * n_out)
}

/// `rmsnorm(x)·w_norm` followed by the matmul with `w` (the fused q8_1 path of the GEMV).
#[allow(clippy::too_many_arguments)]
pub fn norm_matmul<B: TestIo>(b: &B, x: &[f32], w_norm: &[f32], eps: f32, wtype: GgmlType, w: &[u8], n_out: usize, bias: Option<&[f32]>) -> Result<Vec<f32>> {
    let k = w_norm.len();
    let n_rows = x.len() / k;
    let nw = f32_weight(b, "norm", w_norm)?;
    let wt = weight(b, "w", wtype, &[k, n_out], w.to_vec())?;
    let bt = bias.map(|v| f32_weight(b, "bias", v)).transpose()?;
    let xb = b.upload(x)?;
    let mut h = out_buf(b, n_rows * k)?;
    b.rmsnorm(&xb, &nw, eps, n_rows, k, &mut h)?;
    let mut out = out_buf(b, n_rows * n_out)?;
    b.matmul(&wt, bt.as_ref(), &h, n_rows, &mut out)?;
    read(b, &out, n_rows * n_out)
}

/// `swiglu(gate, up)` followed by the matmul with `w` (`[k = gate row length, n_out]`).
pub fn swiglu_matmul<B: TestIo>(b: &B, gate: &[f32], up: &[f32], k: usize, wtype: GgmlType, w: &[u8], n_out: usize) -> Result<Vec<f32>> {
    let n_rows = gate.len() / k;
    let wt = weight(b, "w", wtype, &[k, n_out], w.to_vec())?;
    let mut g = b.upload(gate)?;
    let u = b.upload(up)?;
    b.swiglu(&mut g, &u, gate.len())?;
    let mut out = out_buf(b, n_rows * n_out)?;
    b.matmul(&wt, None, &g, n_rows, &mut out)?;
    read(b, &out, n_rows * n_out)
}

pub fn rmsnorm<B: TestIo>(b: &B, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>> {
    let dim = w.len();
    let n_rows = x.len() / dim;
    let wt = f32_weight(b, "norm", w)?;
    let xb = b.upload(x)?;
    let mut out = out_buf(b, x.len())?;
    b.rmsnorm(&xb, &wt, eps, n_rows, dim, &mut out)?;
    read(b, &out, x.len())
}

/// RoPE of `x` (`[n_rows, n_heads, head_dim]`) at `positions`.
pub fn rope<B: TestIo>(b: &B, x: &[f32], positions: &[u32], n_heads: usize, head_dim: usize, params: &RopeParams, freq_factors: Option<&[f32]>) -> Result<Vec<f32>> {
    let n_rows = positions.len();
    check_len("x", x.len(), n_rows * n_heads * head_dim)?;
    let plan = simple_plan(&vec![0; n_rows], positions);
    let mut batch = b.alloc_batch(limits_for(&plan, 1))?;
    b.set_batch(&mut batch, &plan)?;
    let ff = freq_factors.map(|v| f32_weight(b, "rope_freqs", v)).transpose()?;
    let mut xb = b.upload(x)?;
    b.rope(&mut xb, &batch, n_rows, n_heads, head_dim, params, ff.as_ref())?;
    read(b, &xb, x.len())
}

pub fn swiglu<B: TestIo>(b: &B, gate: &[f32], up: &[f32]) -> Result<Vec<f32>> {
    check_len("up", up.len(), gate.len())?;
    let mut g = b.upload(gate)?;
    let u = b.upload(up)?;
    b.swiglu(&mut g, &u, gate.len())?;
    read(b, &g, gate.len())
}

pub fn add<B: TestIo>(b: &B, x: &[f32], y: &[f32]) -> Result<Vec<f32>> {
    check_len("y", y.len(), x.len())?;
    let mut xb = b.upload(x)?;
    let yb = b.upload(y)?;
    b.add(&mut xb, &yb, x.len())?;
    read(b, &xb, x.len())
}

/// Rows `tokens` of the table (`n_vocab` rows of `dim` in `wtype` blocks), dequantized.
pub fn embed<B: TestIo>(b: &B, wtype: GgmlType, table: &[u8], n_vocab: usize, dim: usize, tokens: &[u32]) -> Result<Vec<f32>> {
    let wt = weight(b, "token_embd", wtype, &[dim, n_vocab], table.to_vec())?;
    let plan = simple_plan(tokens, &vec![0; tokens.len()]);
    let mut batch = b.alloc_batch(limits_for(&plan, 1))?;
    b.set_batch(&mut batch, &plan)?;
    let mut out = out_buf(b, tokens.len() * dim)?;
    b.embed(&wt, &batch, tokens.len(), &mut out)?;
    read(b, &out, tokens.len() * dim)
}

/// `x[rows[j], :]` for every j (rows of `dim`).
pub fn gather_rows<B: TestIo>(b: &B, x: &[f32], dim: usize, rows: &[u32]) -> Result<Vec<f32>> {
    let n = x.len() / dim;
    let mut plan = simple_plan(&vec![0; n], &vec![0; n]);
    plan.logit_rows.extend_from_slice(rows);
    let mut batch = b.alloc_batch(limits_for(&plan, 1))?;
    b.set_batch(&mut batch, &plan)?;
    let xb = b.upload(x)?;
    let mut out = out_buf(b, rows.len() * dim)?;
    b.gather_logit_rows(&xb, &batch, dim, &mut out)?;
    read(b, &out, rows.len() * dim)
}

pub fn argmax<B: TestIo>(b: &B, x: &[f32], n_cols: usize) -> Result<Vec<u32>> {
    let n_rows = x.len() / n_cols;
    let xb = b.upload(x)?;
    let mut out = vec![0u32; n_rows];
    b.argmax_rows(&xb, n_rows, n_cols, &mut out)?;
    Ok(out)
}

/// The geometry of an attention test: sequences of `(n_past, n_rows)`, heads, and a permutation
/// of physical KV blocks (so that block tables are not the identity).
pub struct AttnCase<'a> {
    pub seqs: &'a [(usize, usize)],
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Physical block of each logical block, consumed in sequence order; must be a permutation
    /// of `0..len` with at least Σ ⌈(n_past + n_rows)/32⌉ entries.
    pub block_perm: &'a [u32],
    /// Sliding window ([`AttnParams::window`]). With a window, the attention's block tables
    /// point every block wholly before a sequence's first new row's window at one extra
    /// physical block filled with `+inf` K and V (as an engine's released, reused block could
    /// hold anything): a kernel that reads it gives NaN (`0·inf` in `P·V`).
    pub window: Option<u32>,
}

/// Writes every sequence's K/V (`k`, `v`: for each sequence in order, `n_past + n_rows` rows of
/// `[n_head_kv · head_dim]`) through `kv_write`, then runs `attention` for the new rows (`q`:
/// `[Σ n_rows, n_head · head_dim]`). Returns `(attention output, K read back, V read back)`; the
/// read-back is in the order of `k`.
pub fn attention<B: TestIo>(b: &B, case: &AttnCase<'_>, q: &[f32], k: &[f32], v: &[f32]) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    const BS: usize = 32;
    let kvw = case.n_head_kv * case.head_dim;
    let qw = case.n_head * case.head_dim;
    let ctx_total: usize = case.seqs.iter().map(|&(p, r)| p + r).sum();
    let rows_total: usize = case.seqs.iter().map(|&(_, r)| r).sum();
    check_len("k", k.len(), ctx_total * kvw)?;
    check_len("v", v.len(), ctx_total * kvw)?;
    check_len("q", q.len(), rows_total * qw)?;
    let need: usize = case.seqs.iter().map(|&(p, r)| (p + r).div_ceil(BS)).sum();
    if case.block_perm.len() < need {
        return Err(FakError::invalid("block_perm", format!("{} blocks given, {need} needed", case.block_perm.len())));
    }
    let n_perm = case.block_perm.len();
    if case.block_perm.iter().any(|&x| x as usize >= n_perm) {
        return Err(FakError::invalid("block_perm", "entries must be < its length"));
    }
    // One more physical block: the poison block of a windowed case.
    let poison = n_perm as u32;
    let n_blocks = n_perm + 1;
    let layout = KvLayout { n_layer: 1, n_blocks, block_size: BS, n_head_kv: case.n_head_kv, head_dim: case.head_dim, state_layers: 0, state_slots: 0, state_len: 0 };
    let mut cache = b.alloc_kv_cache(layout)?;
    let mut tables = Vec::new();
    let mut next = 0;
    for &(p, r) in case.seqs {
        let nb = (p + r).div_ceil(BS);
        tables.push(case.block_perm[next..next + nb].to_vec());
        next += nb;
    }
    let max_blocks = tables.iter().map(|t| t.len()).max().unwrap_or(1);
    // 1. Fill the cache: every position of every sequence.
    let mut fill = BatchPlan::default();
    for (&(p, r), t) in case.seqs.iter().zip(&tables) {
        fill.push_seq(&vec![0; p + r], 0, t, BS, LogitRows::None);
    }
    let mut batch = b.alloc_batch(BatchLimits { max_tokens: ctx_total.max(rows_total).max(BS), max_seqs: case.seqs.len().max(1), max_blocks_per_seq: max_blocks })?;
    b.set_batch(&mut batch, &fill)?;
    let kb = b.upload(k)?;
    let vb = b.upload(v)?;
    b.kv_write(&mut cache, 0, &kb, &vb, &batch, ctx_total)?;
    let scale = 1.0 / (case.head_dim as f32).sqrt();
    let params = AttnParams { n_head: case.n_head, n_head_kv: case.n_head_kv, head_dim: case.head_dim, scale, window: case.window };
    if case.window.is_some() {
        let mut fill = BatchPlan::default();
        fill.push_seq(&[0; BS], 0, &[poison], BS, LogitRows::None);
        b.set_batch(&mut batch, &fill)?;
        let inf = b.upload(&vec![f32::INFINITY; BS * kvw])?;
        b.kv_write(&mut cache, 0, &inf, &inf, &batch, BS)?;
    }
    // 2. Attention of the new rows.
    let mut plan = BatchPlan::default();
    for (&(p, r), t) in case.seqs.iter().zip(&tables) {
        let mut t = t.clone();
        let dead = params.window_start(p) / BS;
        t[..dead].fill(poison);
        plan.push_seq(&vec![0; r], p, &t, BS, LogitRows::None);
    }
    b.set_batch(&mut batch, &plan)?;
    let qb = b.upload(q)?;
    let mut out = out_buf(b, rows_total * qw)?;
    b.attention(&qb, &cache, 0, &batch, rows_total, &params, &mut out)?;
    let o = read(b, &out, rows_total * qw)?;
    let mut kr = Vec::with_capacity(k.len());
    let mut vr = Vec::with_capacity(v.len());
    for (&(p, r), t) in case.seqs.iter().zip(&tables) {
        kr.extend(b.read_kv(&cache, 0, false, t, 0..p + r)?);
        vr.extend(b.read_kv(&cache, 0, true, t, 0..p + r)?);
    }
    Ok((o, kr, vr))
}

/// One matrix of [`matmul_multi`]: `(wtype, blocks, n_out, bias)`.
pub type MatrixCase<'a> = (GgmlType, &'a [u8], usize, Option<&'a [f32]>);

/// Several matrices of the same input through [`Backend::matmul_multi`] (Q/K/V, gate/up):
/// `ws[i] = (wtype, blocks, n_out, bias)`, all rows of `k`; returns each output.
pub fn matmul_multi<B: TestIo>(b: &B, ws: &[MatrixCase<'_>], k: usize, x: &[f32]) -> Result<Vec<Vec<f32>>> {
    let n_rows = x.len() / k.max(1);
    check_len("x", x.len(), n_rows * k)?;
    let mut wts = Vec::new();
    let mut bts = Vec::new();
    for (i, &(t, w, n_out, bias)) in ws.iter().enumerate() {
        wts.push(weight(b, &format!("w{i}"), t, &[k, n_out], w.to_vec())?);
        bts.push(bias.map(|v| f32_weight(b, "bias", v)).transpose()?);
    }
    let xb = b.upload(x)?;
    let mut outs = ws.iter().map(|&(_, _, n_out, _)| out_buf(b, n_rows * n_out)).collect::<Result<Vec<_>>>()?;
    let pairs: Vec<(&B::Weight, Option<&B::Weight>)> = wts.iter().zip(&bts).map(|(w, b)| (w, b.as_ref())).collect();
    let mut refs: Vec<&mut B::Buffer> = outs.iter_mut().collect();
    b.matmul_multi(&pairs, &xb, n_rows, &mut refs)?;
    outs.iter().zip(ws).map(|(o, &(_, _, n_out, _))| read(b, o, n_rows * n_out)).collect()
}

/// `res + x·Wᵀ (+ bias)` through [`Backend::matmul_add`] (the residual add of a projection).
#[allow(clippy::too_many_arguments)]
pub fn matmul_add<B: TestIo>(b: &B, wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], res: &[f32], bias: Option<&[f32]>) -> Result<Vec<f32>> {
    let n_rows = x.len() / k.max(1);
    check_len("x", x.len(), n_rows * k)?;
    check_len("res", res.len(), n_rows * n_out)?;
    let wt = weight(b, "w", wtype, &[k, n_out], w.to_vec())?;
    let bt = bias.map(|v| f32_weight(b, "bias", v)).transpose()?;
    let xb = b.upload(x)?;
    let mut rb = b.upload(res)?;
    let mut tmp = out_buf(b, n_rows * n_out)?;
    b.matmul_add(&wt, bt.as_ref(), &xb, n_rows, n_out, &mut tmp, &mut rb)?;
    read(b, &rb, n_rows * n_out)
}

/// [`Backend::rope_kv_write`] for one sequence of `n` rows at positions `n_past..n_past + n`
/// with the block table `table` (block size 32): returns `(q rotated, K read back, V read back)`,
/// K/V as `[n, n_head_kv, head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write<B: TestIo>(
    b: &B,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_past: usize,
    table: &[u32],
    attn: &AttnParams,
    params: &RopeParams,
    freq_factors: Option<&[f32]>,
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    const BS: usize = 32;
    let kvw = attn.n_head_kv * attn.head_dim;
    let n = k.len() / kvw.max(1);
    check_len("k", k.len(), n * kvw)?;
    check_len("v", v.len(), n * kvw)?;
    check_len("q", q.len(), n * attn.n_head * attn.head_dim)?;
    if table.len() * BS < n_past + n || table.iter().any(|&t| t as usize >= table.len()) {
        return Err(FakError::invalid("table", "must be a permutation covering every position"));
    }
    let layout = KvLayout { n_layer: 1, n_blocks: table.len(), block_size: BS, n_head_kv: attn.n_head_kv, head_dim: attn.head_dim, state_layers: 0, state_slots: 0, state_len: 0 };
    let mut cache = b.alloc_kv_cache(layout)?;
    let mut plan = BatchPlan::default();
    plan.push_seq(&vec![0; n], n_past, table, BS, LogitRows::None);
    let mut batch = b.alloc_batch(BatchLimits { max_tokens: n.max(1), max_seqs: 1, max_blocks_per_seq: table.len() })?;
    b.set_batch(&mut batch, &plan)?;
    let ff = freq_factors.map(|v| f32_weight(b, "rope_freqs", v)).transpose()?;
    let mut qb = b.upload(q)?;
    let mut kb = b.upload(k)?;
    let vb = b.upload(v)?;
    b.rope_kv_write(&mut qb, &mut kb, &vb, &mut cache, 0, &batch, n, attn, params, ff.as_ref(), None)?;
    let qo = read(b, &qb, q.len())?;
    let kr = b.read_kv(&cache, 0, false, table, n_past..n_past + n)?;
    let vr = b.read_kv(&cache, 0, true, table, n_past..n_past + n)?;
    Ok((qo, kr, vr))
}

/// [`Backend::greedy_rows`]: per row of `n_cols`, the argmax and its log-softmax.
pub fn greedy<B: TestIo>(b: &B, x: &[f32], n_cols: usize) -> Result<(Vec<u32>, Vec<f32>)> {
    let n_rows = x.len() / n_cols;
    let xb = b.upload(x)?;
    let mut t = vec![0u32; n_rows];
    let mut l = vec![0f32; n_rows];
    b.greedy_rows(&xb, n_rows, n_cols, &mut t, &mut l)?;
    Ok((t, l))
}

/// [`Backend::top_rows`] over `rows` of `x` (rows of `n_cols`).
pub fn top_rows<B: TestIo>(b: &B, x: &[f32], n_cols: usize, rows: &[u32], m: usize) -> Result<super::TopRows> {
    let xb = b.upload(x)?;
    let mut out = super::TopRows::default();
    b.top_rows(&xb, n_cols, rows, m, &mut out)?;
    Ok(out)
}

/// [`Backend::penalize_rows`]: the penalized logits and the values before.
pub fn penalize<B: TestIo>(b: &B, x: &[f32], n_cols: usize, pens: &[super::LogitPenalty]) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut xb = b.upload(x)?;
    let mut raw = vec![f32::NAN; pens.len()];
    b.penalize_rows(&mut xb, n_cols, pens, &mut raw)?;
    let mut out = vec![0f32; x.len()];
    b.read_f32(&xb, &mut out)?;
    Ok((out, raw))
}

/// [`Backend::draw_rows`].
pub fn draw<B: TestIo>(b: &B, x: &[f32], n_cols: usize, draws: &[super::DrawRequest]) -> Result<super::DrawnRows> {
    let xb = b.upload(x)?;
    let mut out = super::DrawnRows::default();
    b.draw_rows(&xb, n_cols, draws, &mut out)?;
    Ok(out)
}

/// RMSNorm in place of each `w.len()`-element row of `x` (Qwen3's per-head Q/K norm).
pub fn head_norm<B: TestIo>(b: &B, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>> {
    let dim = w.len();
    let n_rows = x.len() / dim.max(1);
    check_len("x", x.len(), n_rows * dim)?;
    let wt = f32_weight(b, "norm", w)?;
    let mut xb = b.upload(x)?;
    b.rmsnorm_inplace(&mut xb, &wt, eps, n_rows, dim)?;
    read(b, &xb, n_rows * dim)
}

/// One expert stack for [`moe_ffn`]: `(type, blocks)` of `n_expert` matrices.
pub type Experts<'a> = (GgmlType, &'a [u8]);

/// A whole mixture-of-experts FFN ([`Backend::moe_ffn`]) on `h` (`[n_rows, d]`) added to `res`
/// (`[n_rows, d]`): the router `gate_inp` (f32 `[d, n_expert]`, row-major by expert), `gate` /
/// `up` (`n_expert` matrices of `n_ff` rows of `d`), `down` (`n_expert` matrices of `d` rows of
/// `n_ff`), `k` experts per row. Returns `(res', ids, weights)`.
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn<B: TestIo>(b: &B, h: &[f32], res: &[f32], d: usize, n_ff: usize, n_expert: usize, k: usize, gate_inp: &[f32], gate: Experts<'_>, up: Experts<'_>, down: Experts<'_>) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let n_rows = h.len() / d.max(1);
    check_len("h", h.len(), n_rows * d)?;
    check_len("res", res.len(), n_rows * d)?;
    check_len("gate_inp", gate_inp.len(), d * n_expert)?;
    let gi = weight(b, "gate_inp", GgmlType::F32, &[d, n_expert], gate_inp.iter().flat_map(|x| x.to_le_bytes()).collect())?;
    let ge = weight(b, "gate_exps", gate.0, &[d, n_ff, n_expert], gate.1.to_vec())?;
    let ue = weight(b, "up_exps", up.0, &[d, n_ff, n_expert], up.1.to_vec())?;
    let de = weight(b, "down_exps", down.0, &[n_ff, d, n_expert], down.1.to_vec())?;
    let hb = b.upload(h)?;
    let mut rb = b.upload(res)?;
    let (mut router, mut ids, mut ws) = (out_buf(b, n_rows * n_expert)?, out_buf(b, n_rows * k)?, out_buf(b, n_rows * k)?);
    let (mut g, mut u, mut e) = (out_buf(b, n_rows * k * n_ff)?, out_buf(b, n_rows * k * n_ff)?, out_buf(b, n_rows * k * d)?);
    let w = MoeWeights { gate_inp: &gi, gate_exps: &ge, up_exps: &ue, down_exps: &de };
    let p = MoeParams { n_embd: d, n_expert, k, n_ff_exp: n_ff, norm_w: true, w_scale: 0.0 };
    let bufs = MoeBuffers { router: &mut router, ids: &mut ids, weights: &mut ws, gate: &mut g, up: &mut u, experts: &mut e };
    b.moe_ffn(&hb, &w, &p, n_rows, bufs, &mut rb)?;
    Ok((read(b, &rb, n_rows * d)?, read(b, &ids, n_rows * k)?, read(b, &ws, n_rows * k)?))
}

/// One Gated DeltaNet layer's shape and f32 weights for [`delta_net`] (row-major as the GGUF
/// rows: `qkv` `[conv_dim][d]`, `gate` `[value_dim][d]`, `beta` / `alpha` `[n_v][d]`, `conv`
/// `[conv_dim][d_conv]`, `out` `[d][value_dim]`).
pub struct DeltaNetCase<'a> {
    pub d: usize,
    pub d_conv: usize,
    pub d_state: usize,
    pub n_k: usize,
    pub n_v: usize,
    pub eps: f32,
    pub qkv: &'a [f32],
    pub gate: &'a [f32],
    pub beta: &'a [f32],
    pub alpha: &'a [f32],
    pub conv: &'a [f32],
    pub dt_bias: &'a [f32],
    pub a: &'a [f32],
    pub norm: &'a [f32],
    pub out: &'a [f32],
}

/// [`Backend::delta_net`] on `h` (`[n_rows, d]`) for the sequences `seqs` (`(n_rows, n_past,
/// state slot)` each, rows in order) from the recurrent states `state0` (`[n_slots, state_len]`).
/// Returns the layer's output `[n_rows, d]` and the states after it `[n_slots, state_len]`.
pub fn delta_net<B: TestIo>(b: &B, c: &DeltaNetCase<'_>, h: &[f32], seqs: &[(usize, usize, usize)], n_slots: usize, state0: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
    let p = DeltaNetParams { n_embd: c.d, d_conv: c.d_conv, d_state: c.d_state, n_k_heads: c.n_k, n_v_heads: c.n_v, state_layer: 0, eps: c.eps };
    let (d, cd, vd, nv) = (c.d, p.conv_dim(), p.value_dim(), c.n_v);
    if c.d_conv == 0 || seqs.iter().any(|&(_, _, slot)| slot >= n_slots) {
        return Err(FakError::invalid("seqs", "d_conv ≥ 1 and state slots below n_slots"));
    }
    let state_len = (c.d_conv - 1) * cd + nv * c.d_state * c.d_state;
    for (what, got, want) in [
        ("qkv", c.qkv.len(), d * cd),
        ("gate", c.gate.len(), d * vd),
        ("beta", c.beta.len(), d * nv),
        ("alpha", c.alpha.len(), d * nv),
        ("conv", c.conv.len(), c.d_conv * cd),
        ("dt_bias", c.dt_bias.len(), nv),
        ("a", c.a.len(), nv),
        ("norm", c.norm.len(), c.d_state),
        ("out", c.out.len(), vd * d),
        ("state0", state0.len(), n_slots * state_len),
    ] {
        check_len(what, got, want)?;
    }
    let n_rows: usize = seqs.iter().map(|s| s.0).sum();
    check_len("h", h.len(), n_rows * d)?;
    let mat = |name: &str, v: &[f32], k: usize, n: usize| weight(b, name, GgmlType::F32, &[k, n], v.iter().flat_map(|x| x.to_le_bytes()).collect());
    let (wqkv, wgate, wbeta, walpha) = (mat("qkv", c.qkv, d, cd)?, mat("gate", c.gate, d, vd)?, mat("beta", c.beta, d, nv)?, mat("alpha", c.alpha, d, nv)?);
    let (wconv, wout) = (mat("conv", c.conv, c.d_conv, cd)?, mat("out", c.out, vd, d)?);
    let (wdt, wa, wnorm) = (f32_weight(b, "dt_bias", c.dt_bias)?, f32_weight(b, "a", c.a)?, f32_weight(b, "norm", c.norm)?);
    const BS: usize = 32;
    let mut plan = BatchPlan::default();
    let mut next_block = 0u32;
    let mut max_blocks = 1;
    for &(rows, n_past, slot) in seqs {
        let nb = (n_past + rows).div_ceil(BS).max(1);
        let blocks: Vec<u32> = (next_block..next_block + nb as u32).collect();
        next_block += nb as u32;
        max_blocks = max_blocks.max(nb);
        plan.push_seq(&vec![0u32; rows], n_past, &blocks, BS, LogitRows::None);
        plan.set_state_slot(slot);
    }
    let layout = KvLayout { n_layer: 1, n_blocks: next_block as usize, block_size: BS, n_head_kv: 1, head_dim: 16, state_layers: 1, state_slots: n_slots, state_len };
    let mut cache = b.alloc_kv_cache(layout)?;
    for slot in 0..n_slots {
        b.write_state(&mut cache, 0, slot, &state0[slot * state_len..(slot + 1) * state_len])?;
    }
    let mut batch = b.alloc_batch(BatchLimits { max_tokens: n_rows.max(1), max_seqs: seqs.len().max(1), max_blocks_per_seq: max_blocks })?;
    b.set_batch(&mut batch, &plan)?;
    let hb = b.upload(h)?;
    let mut out = out_buf(b, n_rows * d)?;
    let w = DeltaNetWeights { qkv: &wqkv, gate: &wgate, beta: &wbeta, alpha: &walpha, conv: &wconv, dt_bias: &wdt, a: &wa, norm: &wnorm, out: &wout };
    b.delta_net(&w, &p, &hb, &mut cache, &batch, n_rows, &mut out)?;
    let y = read(b, &out, n_rows * d)?;
    let mut states = Vec::with_capacity(n_slots * state_len);
    for slot in 0..n_slots {
        states.extend(b.read_state(&cache, 0, slot)?);
    }
    Ok((y, states))
}
