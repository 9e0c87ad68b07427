//! The Gated DeltaNet layer of the Qwen3.5/3.6 hybrids (`rust/kernels/deltanet.cu`), the gated
//! attention's and the shared expert's sigmoid gates (`rust/kernels/elementwise.cu`), and the
//! copy of a recurrent-state slot (the prefix cache's checkpoints).
//!
//! One layer over the batch (llama.cpp `qwen35` `build_layer_attn_linear`, the CPU reference
//! `backend::cpu::deltanet`): the four input projections in one matmul call (q/k/v, z, β, α), the
//! causal convolution + SiLU (`gdn_conv_silu_f32`, one thread per channel), the recurrence with
//! the L2 norms, gates and gated RMSNorm (`gdn_recurrence_d<D>`, one block per (sequence, value
//! head), the head's f32 state in registers, each sequence's rows in order), then the output
//! projection. When a sequence of the batch has at least [`gdn_chunk_min_rows`] rows (a prefill;
//! opt-in until run on a GPU), the recurrence runs chunked instead (`gdn_chunk_d<D>`: chunks of 64 rows in the WY form, one
//! block per (sequence, value head, slice of 32 value columns); then `gdn_gated_norm_f32`), for
//! every sequence of that batch (a decoding one is a partial chunk of one row). Per-sequence rows, `n_past` and state slots come from the batch's device arrays
//! (`seqs`, `states`), so a decode step stays one capturable graph; the intermediate rows live in
//! backend scratch sized for the batch limits on first use and never shrunk (superseded
//! allocations stay alive for graphs captured with them).

use std::cell::Cell;

use super::super::launch::Args;
use super::super::{intern, CudaBackend, CudaBatch, CudaBuffer, CudaKvCache, CudaWeight, MEMORY};
use crate::backend::{DeltaNetParams, DeltaNetWeights};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// State sizes `D` (`ssm.state_size`) with a compiled recurrence kernel, and the threads per row
/// of the state (`P` in `deltanet.cu`).
const STATE_DIMS: [(usize, usize); 4] = [(16, 1), (32, 1), (64, 1), (128, 2)];

/// Rows of one chunk of `gdn_chunk_d<D>` (`GDN_CHUNK`) and its threads (`GDN_CHUNK_THREADS`).
const CHUNK: usize = 64;
const CHUNK_THREADS: u32 = 256;

/// With the chunked path on, a batch runs the chunked recurrence when one of its sequences has at
/// least this many rows (one whole chunk); fewer run token by token (decode steps always: one row
/// each).
pub const GDN_CHUNK_MIN_ROWS: usize = CHUNK;

/// The chunked path's threshold of a backend created now: `FAK_GDN_CHUNK_MIN_ROWS` (1: always
/// chunked; [`GDN_CHUNK_MIN_ROWS`] the intended default; a huge value: never — tests' and benches'
/// A/B). Unset: **off** (`usize::MAX`) until the kernel has run on a GPU — written 2026-12-08 in a
/// session that got no GPU, its arithmetic proved only by the numpy model
/// (`tests/test_gdn_chunk_model.py`). Read by `CudaBackend::new`, so that each engine made after
/// setting it uses it.
pub(crate) fn gdn_chunk_min_rows() -> usize {
    std::env::var("FAK_GDN_CHUNK_MIN_ROWS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(usize::MAX).max(1)
}

/// Value columns per block of `gdn_chunk_d<D>` (`GDN_CHUNK_JB`).
fn chunk_jb(d: usize) -> usize {
    d.min(32)
}

/// Dynamic shared memory of `gdn_chunk_d<D>` in bytes (`GdnChunkLayout<D, JB>::FLOATS` floats):
/// q and k `[64][D + 4]`, the state slice `[D][SP]`, R `[64][JB + 4]`, A and Q·Kᵀ `[64][65]`, and
/// three vectors of 64.
fn chunk_smem(d: usize) -> usize {
    let jb = chunk_jb(d);
    let sp = jb + if jb.is_multiple_of(32) { 16 } else { 0 };
    4 * (2 * CHUNK * (d + 4) + d * sp + CHUNK * (jb + 4) + 2 * CHUNK * (CHUNK + 1) + 3 * CHUNK)
}

/// Most convolution taps (`GDN_MAX_CONV` in `deltanet.cu`).
const MAX_CONV: usize = 8;

/// The intermediate rows of one layer: `qkv` / `conv` `[rows, conv_dim]`, `z` / `core`
/// `[rows, value_dim]`, `beta` / `alpha` `[rows, n_v_heads]`.
pub(crate) struct GdnBuffers {
    qkv: CudaBuffer,
    conv: CudaBuffer,
    z: CudaBuffer,
    core: CudaBuffer,
    beta: CudaBuffer,
    alpha: CudaBuffer,
}

/// The Gated DeltaNet scratch of a backend (see the module doc).
#[derive(Default)]
pub(crate) struct GdnScratch {
    cur: Option<GdnBuffers>,
    /// Superseded allocations kept alive for graphs captured with them.
    old: Vec<GdnBuffers>,
}

fn grid_for(n: usize, per_block: usize) -> u32 {
    n.div_ceil(per_block).clamp(1, 8192) as u32
}

/// The f32 values of a 1-D weight of `n` elements (widened at load), or an error naming it.
fn f32_vector(w: &CudaWeight, n: usize) -> Result<u64> {
    if w.wtype != GgmlType::F32 || w.host.is_some() || w.dims.iter().product::<usize>() != n {
        return Err(FakError::model(format!("tensor {} ({:?} of {}) is not the f32 vector of {n} a Gated DeltaNet layer needs", w.name, w.dims, w.wtype.name())));
    }
    Ok(w.mem.ptr())
}

impl CudaBackend {
    /// A buffer of `n` f32 with its 8-bit side area, not zeroed (no memset: it may be created
    /// while a forward is captured).
    fn gdn_buffer(&self, n: usize) -> Result<CudaBuffer> {
        let mem = self.alloc_tracked(4 * n.max(1), &MEMORY.activations)?;
        let (q8_off, q8_bytes) = CudaBuffer::q8_layout(n);
        let q8 = self.alloc_tracked(q8_bytes, &MEMORY.activations)?;
        Ok(CudaBuffer { mem, len: n, q8, q8_off, q8_len: Cell::new(0), q8k_len: Cell::new(0) })
    }

    /// One Gated DeltaNet layer over the batch (see [`crate::backend::Backend::delta_net`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_delta_net(&self, w: &DeltaNetWeights<'_, CudaWeight>, p: &DeltaNetParams, h: &CudaBuffer, cache: &mut CudaKvCache, batch: &CudaBatch, n: usize, out: &mut CudaBuffer) -> Result<()> {
        let (cd, vd, nv, nk, ds, dc) = (p.conv_dim(), p.value_dim(), p.n_v_heads, p.n_k_heads, p.d_state, p.d_conv);
        let l = cache.layout;
        let state_len = (dc - 1) * cd + nv * ds * ds;
        if cache.state.is_none() || l.state_len != state_len || p.state_layer >= l.state_layers {
            return Err(FakError::invalid("delta_net", format!("state layer {} of {} ({} values) for a layer of {state_len}", p.state_layer, l.state_layers, l.state_len)));
        }
        let Some(&(_, per_row)) = STATE_DIMS.iter().find(|(d, _)| *d == ds) else {
            return Err(FakError::Unsupported(format!("CUDA Gated DeltaNet with a state size of {ds} (compiled: 16, 32, 64, 128)")));
        };
        if dc == 0 || dc > MAX_CONV || nk == 0 || nv == 0 {
            return Err(FakError::Unsupported(format!("CUDA Gated DeltaNet with {dc} convolution taps (1 to {MAX_CONV}), {nk} q/k heads, {nv} v heads")));
        }
        if w.conv.wtype != GgmlType::F32 || w.conv.host.is_some() || w.conv.dims.iter().product::<usize>() != dc * cd {
            return Err(FakError::model(format!("tensor {} ({:?} of {}) is not the f32 [{dc}, {cd}] convolution the layer needs", w.conv.name, w.conv.dims, w.conv.wtype.name())));
        }
        let (dt, a, norm) = (f32_vector(w.dt_bias, nv)?, f32_vector(w.a, nv)?, f32_vector(w.norm, ds)?);
        let n_seqs = batch.plan.seqs.len();
        if n > h.len / p.n_embd.max(1) || n * p.n_embd > out.len {
            return Err(FakError::invalid("delta_net", format!("{n} rows of {} exceed the buffers ({} / {})", p.n_embd, h.len, out.len)));
        }
        if n == 0 || n_seqs == 0 {
            return Ok(());
        }
        let mut g = self.gdn.lock().unwrap_or_else(|e| e.into_inner());
        let rows = n.max(batch.limits.max_tokens);
        let fits = |b: &GdnBuffers| b.qkv.len >= n * cd && b.conv.len >= n * cd && b.z.len >= n * vd && b.core.len >= n * vd && b.beta.len >= n * nv && b.alpha.len >= n * nv;
        if !g.cur.as_ref().is_some_and(fits) {
            let fresh = GdnBuffers {
                qkv: self.gdn_buffer(rows * cd)?,
                conv: self.gdn_buffer(rows * cd)?,
                z: self.gdn_buffer(rows * vd)?,
                core: self.gdn_buffer(rows * vd)?,
                beta: self.gdn_buffer(rows * nv)?,
                alpha: self.gdn_buffer(rows * nv)?,
            };
            if let Some(old) = g.cur.replace(fresh) {
                g.old.push(old);
            }
        }
        let s = g.cur.as_mut().expect("allocated above");
        self.op_matmul_multi(&[(w.qkv, None), (w.gate, None), (w.beta, None), (w.alpha, None)], h, n, &mut [&mut s.qkv, &mut s.z, &mut s.beta, &mut s.alpha])?;
        let state = cache.state_layer(p.state_layer);
        s.conv.written();
        self.launch(
            "deltanet",
            "gdn_conv_silu_f32",
            (n_seqs as u32, cd.div_ceil(128) as u32, 1),
            128,
            0,
            Args::new()
                .ptr(s.qkv.ptr())
                .ptr(s.conv.ptr())
                .ptr(w.conv.mem.ptr())
                .ptr(state)
                .ptr(batch.seqs())
                .ptr(batch.states())
                .i32(cd as i32)
                .i32(dc as i32)
                .u64(state_len as u64),
        )?;
        s.core.written();
        let max_rows = batch.plan.seqs.iter().map(|q| q.n_rows as usize).max().unwrap_or(0);
        // (sm_86/89 opt in to 99 KiB of shared memory per block: too little for D = 128)
        if max_rows >= self.gdn_chunk_min_rows && chunk_smem(ds) <= self.dev.info.max_smem_optin.max(0) as usize {
            self.launch(
                "deltanet",
                intern(format!("gdn_chunk_d{ds}")),
                (n_seqs as u32, nv as u32, (ds / chunk_jb(ds)) as u32),
                CHUNK_THREADS,
                chunk_smem(ds) as u32,
                Args::new()
                    .ptr(s.conv.ptr())
                    .ptr(s.alpha.ptr())
                    .ptr(s.beta.ptr())
                    .ptr(dt)
                    .ptr(a)
                    .ptr(state)
                    .ptr(batch.seqs())
                    .ptr(batch.states())
                    .ptr(s.core.ptr())
                    .i32(nk as i32)
                    .i32(nv as i32)
                    .u64(((dc - 1) * cd) as u64)
                    .u64(state_len as u64)
                    .f32(p.eps),
            )?;
            self.launch(
                "deltanet",
                "gdn_gated_norm_f32",
                (n as u32, nv.div_ceil(4) as u32, 1),
                128,
                0,
                Args::new().ptr(s.core.ptr()).ptr(s.z.ptr()).ptr(norm).i32(nv as i32).i32(ds as i32).f32(p.eps),
            )?;
            return self.op_matmul(w.out, None, &s.core, n, out, false);
        }
        self.launch(
            "deltanet",
            intern(format!("gdn_recurrence_d{ds}")),
            (n_seqs as u32, nv as u32, 1),
            (ds * per_row).max(32) as u32,
            0,
            Args::new()
                .ptr(s.conv.ptr())
                .ptr(s.z.ptr())
                .ptr(s.alpha.ptr())
                .ptr(s.beta.ptr())
                .ptr(dt)
                .ptr(a)
                .ptr(norm)
                .ptr(state)
                .ptr(batch.seqs())
                .ptr(batch.states())
                .ptr(s.core.ptr())
                .i32(nk as i32)
                .i32(nv as i32)
                .u64(((dc - 1) * cd) as u64)
                .u64(state_len as u64)
                .f32(p.eps),
        )?;
        self.op_matmul(w.out, None, &s.core, n, out, false)
    }

    /// Copies recurrent-state slot `from` of every state layer to slot `to`.
    pub(crate) fn op_copy_state(&self, cache: &mut CudaKvCache, from: usize, to: usize) -> Result<()> {
        let l = cache.layout;
        if from >= l.state_slots || to >= l.state_slots {
            return Err(FakError::invalid("state slot", format!("copy of slot {from} to {to} of {}", l.state_slots)));
        }
        if from == to || cache.state.is_none() || l.state_layers == 0 {
            return Ok(());
        }
        self.launch(
            "deltanet",
            "gdn_copy_state_f32",
            (grid_for(l.state_len, 1024).min(1024), l.state_layers as u32, 1),
            256,
            0,
            Args::new().ptr(cache.state_layer(0)).u64(l.state_slots as u64).u64(l.state_len as u64).u64(from as u64).u64(to as u64),
        )
    }

    /// Gated attention's split of the query projection (see
    /// [`crate::backend::Backend::split_q_gate`]).
    pub(crate) fn op_split_q_gate(&self, qg: &CudaBuffer, n_rows: usize, n_head: usize, head_dim: usize, q: &mut CudaBuffer, gate: &mut CudaBuffer) -> Result<()> {
        let n = n_rows * n_head * head_dim;
        if 2 * n > qg.len || n > q.len || n > gate.len || n > i32::MAX as usize {
            return Err(FakError::invalid("split_q_gate", format!("{n_rows} rows of {n_head}×{head_dim} exceed the buffers")));
        }
        q.written();
        gate.written();
        self.launch("elementwise", "split_q_gate_f32", (grid_for(n, 1024), 1, 1), 256, 0, Args::new().ptr(qg.ptr()).ptr(q.ptr()).ptr(gate.ptr()).i32(head_dim as i32).i32(n as i32))
    }

    /// `x[i] *= sigmoid(gate[i])`, `i < n`.
    pub(crate) fn op_mul_sigmoid(&self, x: &mut CudaBuffer, gate: &CudaBuffer, n: usize) -> Result<()> {
        if n > x.len || n > gate.len || n > i32::MAX as usize {
            return Err(FakError::invalid("mul_sigmoid", format!("{n} elements exceed the buffers ({} / {})", x.len, gate.len)));
        }
        x.written();
        self.launch("elementwise", "mul_sigmoid_f32", (grid_for(n, 1024), 1, 1), 256, 0, Args::new().ptr(x.ptr()).ptr(gate.ptr()).i32(n as i32))
    }

    /// `x[r, :] *= sigmoid(g[r])` for `n_rows` rows of `dim`.
    pub(crate) fn op_mul_rows_sigmoid(&self, x: &mut CudaBuffer, g: &CudaBuffer, n_rows: usize, dim: usize) -> Result<()> {
        let n = n_rows * dim;
        if n > x.len || n_rows > g.len || n > i32::MAX as usize || dim == 0 {
            return Err(FakError::invalid("mul_rows_sigmoid", format!("{n_rows} rows of {dim} exceed the buffers ({} / {})", x.len, g.len)));
        }
        x.written();
        self.launch("elementwise", "mul_rows_sigmoid_f32", (grid_for(n, 1024), 1, 1), 256, 0, Args::new().ptr(x.ptr()).ptr(g.ptr()).i32(dim as i32).i32(n as i32))
    }
}
