//! Mixture-of-experts FFN on the GPU (`rust/kernels/moe.cu`, `mmvq_id_*` in `mmvq.cu`, `mmq_id_*`
//! in `mmq.cu`), all on the device (no host synchronisation, so a decode step stays one graph):
//! - the router: the f32 router GEMV/GEMM, then `moe_route_f32` (softmax, top-k, renormalized
//!   weights in one kernel, one warp per row);
//! - decode (≤ [`MOE_GEMV_MAX_ROWS`] rows): `mmvq_id_*`, a GEMV per (row, chosen expert) pair
//!   that reads only the chosen experts' rows through the ids on the device (gate and up in one
//!   launch), then SwiGLU and the down GEMV the same way;
//! - prefill and large batches: `moe_sort` groups the pairs by expert (a compact index and a
//!   tile table built on the device), `moe_gather_q8` lays the pairs' 8-bit activations out in
//!   that order, and `mmq_id_*` runs one grouped int8 tensor-core GEMM tile per (expert, up to
//!   16/32/64 pairs: [`tile_rows`]) — in the fragment mode for Q4_K/Q6_K, as the dense prefill
//!   GEMM — the gate/up outputs, the SwiGLU and the down outputs staying in sorted order;
//! - `moe_combine_f32`: the weighted sum in slot order added to the residual (through the sorted
//!   positions in the grouped path).
//!
//! The experts of `--cpu-moe` layers (blocks in host memory): `moe_host.rs`.

use super::super::launch::Args;
use super::super::{is_dense, kernel_fmt, CudaBackend, CudaBuffer, CudaWeight, Tracked, MEMORY};
use crate::backend::{MoeBuffers, MoeParams, MoeWeights};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Rows up to which the expert products run as GEMVs over the pairs (decode: a batch of up to
/// this many sequences); above it, the expert-sorted grouped GEMM.
pub const MOE_GEMV_MAX_ROWS: usize = 16;

/// [`MOE_GEMV_MAX_ROWS`], or `FAK_MOE_GEMV_MAX_ROWS` when set (a bench's A/B of the crossover;
/// read once).
fn gemv_max_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| std::env::var("FAK_MOE_GEMV_MAX_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(MOE_GEMV_MAX_ROWS))
}

/// Pairs per tile of the grouped GEMM (`mmq_id_*_q8_n<BN>`): the smallest of 16, 32, 64 that holds
/// the pairs an expert gets on average (`n_pairs / n_expert`, known on the host without looking
/// at the router's choice). A 64-sequence decode step of a 128-expert, 8-used model gives ≈ 4
/// pairs per expert: a 64-row tile did 16× the tensor work it needed. The choice depends only on
/// the step's row count, so a captured graph replays the same kernels.
pub fn tile_rows(n_pairs: usize, n_expert: usize) -> usize {
    super::matmul_plan::tile_n(n_pairs.div_ceil(n_expert.max(1)))
}

/// The grouped GEMM's index and gathered activations, grown on first use and never shrunk.
/// Superseded allocations stay alive (`old`): a CUDA graph captured with them replays their
/// pointers (a 64-sequence decode graph captured before a 512-token prefill grew the index
/// read freed memory on replay: `CUDA_ERROR_ILLEGAL_ADDRESS` on the 30B-A3B twin, H100,
/// 2026-12-07; graph capture of the grouped path was off until this was found).
#[derive(Default)]
pub(crate) struct MoeScratch {
    old: Vec<Tracked>,
    /// `sorted` (u32 × pairs) | `pos` (u32 × pairs) | `tiles` (u32 × (1 + 3·max tiles)).
    index: Option<Tracked>,
    index_pairs: usize,
    index_tiles: usize,
    /// The 8-bit forms of the gathered activations (a `CudaBuffer`'s side area layout).
    xs: Option<Tracked>,
    xs_elems: usize,
}

fn is_kquant(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// The stacked experts' geometry `(k_in, n_out, n_expert, bytes per expert)`.
fn experts(w: &CudaWeight) -> Result<(usize, usize, usize, usize)> {
    if w.dims.len() != 3 {
        return Err(FakError::model(format!("tensor {} is not a stack of expert matrices", w.name)));
    }
    if w.host.is_some() {
        return Err(FakError::invalid("experts", format!("{} is in host memory (--cpu-moe): the CPU runs it", w.name)));
    }
    if is_dense(w.wtype) || kernel_fmt(w.wtype).is_none() {
        return Err(FakError::Unsupported(format!(
            "expert tensor {} of type {}: the CUDA expert kernels run the quantized formats (Q4_0 … Q8_0, Q4_K, Q5_K, Q6_K)",
            w.name,
            w.wtype.name()
        )));
    }
    Ok((w.dims[0], w.dims[1], w.dims[2], w.dims[1] * w.row_bytes))
}

impl CudaBackend {
    /// RMSNorm of `n_rows` rows of `dim` in place (no 8-bit forms: RoPE rewrites the rows next).
    pub(crate) fn op_rmsnorm_inplace(&self, x: &mut CudaBuffer, w: &CudaWeight, eps: f32, n_rows: usize, dim: usize) -> Result<()> {
        if w.wtype != GgmlType::F32 || w.k() != dim || !w.is_vector() {
            return Err(FakError::model(format!("tensor {} must be a vector of {dim} values", w.name)));
        }
        if n_rows * dim > x.len {
            return Err(FakError::invalid("rmsnorm", format!("{n_rows} rows of {dim} exceed the buffer ({})", x.len)));
        }
        x.written();
        // The register kernel reads its row into registers, sums, then writes: in place is safe.
        let chunks = dim.div_ceil(256);
        if chunks > 32 * 4 {
            return self.launch("norm", "rmsnorm_f32", (n_rows as u32, 1, 1), 1024, 0, Args::new().ptr(x.ptr()).ptr(w.mem.ptr()).ptr(x.ptr()).i32(dim as i32).f32(eps));
        }
        let warps = chunks.min(32);
        let name = match chunks.div_ceil(warps) {
            1 => "rmsnorm_f32_q8_c1",
            2 => "rmsnorm_f32_q8_c2",
            _ => "rmsnorm_f32_q8_c4",
        };
        self.launch(
            "norm",
            name,
            (n_rows as u32, 1, 1),
            (32 * warps) as u32,
            0,
            Args::new().ptr(x.ptr()).ptr(w.mem.ptr()).ptr(x.ptr()).ptr(0).ptr(0).ptr(0).ptr(0).ptr(0).i32(0).i32(dim as i32).f32(eps),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_moe_route(&self, logits: &CudaBuffer, n_rows: usize, n_expert: usize, k: usize, norm_w: bool, w_scale: f32, ids: &mut CudaBuffer, weights: &mut CudaBuffer) -> Result<()> {
        if n_expert > crate::model::config::MAX_EXPERTS || k == 0 || k > n_expert {
            return Err(FakError::invalid("moe", format!("{k} of {n_expert} experts")));
        }
        if n_rows * n_expert > logits.len || n_rows * k > ids.len || n_rows * k > weights.len {
            return Err(FakError::invalid("moe", format!("{n_rows} rows exceed the router buffers")));
        }
        ids.written();
        weights.written();
        self.launch(
            "moe",
            "moe_route_f32",
            (n_rows as u32, 1, 1),
            32,
            0,
            Args::new().ptr(logits.ptr()).ptr(ids.ptr()).ptr(weights.ptr()).i32(n_expert as i32).i32(k as i32).i32(norm_w as i32).f32(w_scale),
        )
    }

    /// The expert GEMV of up to two stacked tensors of the same shape and format (gate and up):
    /// `outs[j][p, :] = ws[j]_e · x[i, :]` over the `n_rows · k` pairs (see
    /// [`crate::backend::Backend::matmul_id`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_matmul_id(&self, ws: &[&CudaWeight], x: &CudaBuffer, ids: &CudaBuffer, n_rows: usize, k: usize, x_per_pair: bool, outs: &mut [&mut CudaBuffer]) -> Result<()> {
        debug_assert!(!ws.is_empty() && ws.len() <= 2 && ws.len() == outs.len());
        let (k_in, n_out, _, estride) = experts(ws[0])?;
        for w in &ws[1..] {
            if experts(w)? != experts(ws[0])? || w.wtype != ws[0].wtype {
                return Err(FakError::model(format!("{} and {} differ in shape or format", ws[0].name, w.name)));
            }
        }
        let n_pairs = n_rows * k;
        let n_x = if x_per_pair { n_pairs } else { n_rows };
        if n_x * k_in > x.len || n_pairs > ids.len || outs.iter().any(|o| n_pairs * n_out > o.len) {
            return Err(FakError::invalid("matmul_id", format!("{n_pairs} pairs of {k_in} → {n_out} exceed the buffers")));
        }
        for o in outs.iter_mut() {
            o.written();
        }
        if n_pairs == 0 {
            return Ok(());
        }
        let kform = is_kquant(ws[0].wtype);
        let (yq, ya, ys) = self.q8_operands(x, n_x * k_in, kform)?;
        // One warp per row, 4 rows a block (half a warp per row, 8 a block, for rows of 33..63
        // tasks of 32): the pairs give the grid its width, so no row is split across warps (the
        // dense GEMV's shape for small matrices would leave half the lanes idle at K = 2048).
        let tasks = k_in / 32;
        let rpb = if tasks > 32 && tasks < 64 { 8 } else { 4 };
        let d1 = outs.get(1).map_or(0, |o| o.ptr());
        let w1 = ws.get(1).map_or(0, |w| w.mem.ptr());
        let name = if kform { "mmvq_id_kquant_q8_K" } else { "mmvq_id_legacy_q8_0" };
        self.launch(
            "mmvq",
            name,
            (n_out.div_ceil(rpb) as u32, n_pairs as u32, ws.len() as u32),
            128,
            0,
            Args::new()
                .ptr(ws[0].mem.ptr())
                .ptr(w1)
                .u64(ws[0].row_bytes as u64)
                .u64(estride as u64)
                .ptr(outs[0].ptr())
                .ptr(d1)
                .i32(n_out as i32)
                .i32(rpb as i32)
                .i32(ws[0].wtype as i32)
                .ptr(ids.ptr())
                .i32(k as i32)
                .i32(x_per_pair as i32)
                .ptr(yq)
                .ptr(ya)
                .ptr(ys)
                .i32(k_in as i32),
        )
    }

    /// `res[r, :] += Σ_s w[r·k + s] · experts[q(r·k + s), :]`, `q` the sorted positions `pos`
    /// (device pointer; 0: the identity).
    pub(crate) fn op_moe_combine(&self, experts: &CudaBuffer, weights: &CudaBuffer, pos: u64, n_rows: usize, k: usize, dim: usize, res: &mut CudaBuffer) -> Result<()> {
        if n_rows * k * dim > experts.len || n_rows * k > weights.len || n_rows * dim > res.len {
            return Err(FakError::invalid("moe_combine", format!("{n_rows} rows exceed the buffers")));
        }
        res.written();
        self.launch(
            "moe",
            "moe_combine_f32",
            (n_rows as u32, dim.div_ceil(256) as u32, 1),
            256,
            0,
            Args::new().ptr(experts.ptr()).ptr(weights.ptr()).ptr(pos).ptr(res.ptr()).i32(k as i32).i32(dim as i32),
        )
    }

    /// The index `(sorted, pos, tiles)` and gathered-activation pointers for `n_pairs` pairs of
    /// `k_in` values in at most `max_tiles` GEMM tiles, grown when needed.
    fn moe_scratch(&self, n_pairs: usize, max_tiles: usize, k_in: usize) -> Result<((u64, u64, u64), [u64; 5])> {
        let mut g = self.moe.lock().unwrap_or_else(|e| e.into_inner());
        let g: &mut MoeScratch = &mut g;
        if g.index_pairs < n_pairs || g.index_tiles < max_tiles {
            let (p, t) = (n_pairs.max(g.index_pairs), max_tiles.max(g.index_tiles));
            let fresh = self.alloc_tracked(4 * (2 * p + 1 + 3 * t), &MEMORY.activations)?;
            if let Some(old) = g.index.replace(fresh) {
                g.old.push(old);
            }
            g.index_pairs = p;
            g.index_tiles = t;
        }
        let elems = n_pairs * k_in;
        let (off, bytes) = CudaBuffer::q8_layout(elems.max(g.xs_elems));
        if g.xs_elems < elems {
            let fresh = self.alloc_tracked(bytes, &MEMORY.activations)?;
            if let Some(old) = g.xs.replace(fresh) {
                g.old.push(old);
            }
            g.xs_elems = elems;
        }
        let base = g.index.as_ref().expect("allocated above").ptr();
        let p = g.index_pairs as u64;
        let xb = g.xs.as_ref().expect("allocated above").ptr();
        let o = off;
        // (qs0, ds0, qsk, dk, sk), as CudaBuffer::q8_ptrs
        let xs = [xb + o[0] as u64, xb + o[2] as u64, xb + o[1] as u64, xb + o[3] as u64, xb + o[4] as u64];
        Ok(((base, base + 4 * p, base + 8 * p), xs))
    }

    /// The grouped GEMM of one stacked tensor over the sorted pairs: `out[j, :] = W_e(j) ·
    /// a[j, :]` for sorted position `j`, activations `(yq, ya, ys)` in sorted order, tiles of
    /// `bn` pairs: the fragment mode (two staged super-blocks) for Q4_K/Q6_K with K % 256 == 0 where
    /// its shared memory fits, else the direct mode, two k-steps per barrier.
    #[allow(clippy::too_many_arguments)]
    fn mmq_id(&self, w: &CudaWeight, (yq, ya, ys): (u64, u64, u64), tiles: u64, max_tiles: usize, bn: usize, out: &mut CudaBuffer) -> Result<()> {
        let (k_in, n_out, _, estride) = experts(w)?;
        let fmt = kernel_fmt(w.wtype).expect("checked by experts()");
        out.written();
        let frag = matches!(w.wtype, GgmlType::Q4_K | GgmlType::Q6_K)
            && k_in.is_multiple_of(256)
            && self.mmq_q8_fits(2, w.wtype, bn, true);
        let (name, smem) = if frag {
            (super::super::intern(format!("mmq_id_{fmt}_q8_n{bn}_f2")), super::matmul::mmq_q8_smem(2, 2, w.wtype, bn, true))
        } else {
            (super::super::intern(format!("mmq_id_{fmt}_q8_n{bn}_p2")), super::matmul::mmq_q8_smem(2, 0, w.wtype, bn, false))
        };
        self.launch(
            "mmq",
            name,
            (n_out.div_ceil(128) as u32, max_tiles as u32, 1),
            256,
            smem,
            Args::new()
                .ptr(w.mem.ptr())
                .u64(w.row_bytes as u64)
                .u64(estride as u64)
                .ptr(yq)
                .ptr(ya)
                .ptr(ys)
                .ptr(out.ptr())
                .i32(k_in as i32)
                .i32(n_out as i32)
                .ptr(tiles),
        )
    }

    /// The whole MoE FFN of `n_rows` rows (see the module doc): `res += Σ_s w_s · FFN_{e_s}(h)`.
    pub(crate) fn op_moe_ffn(&self, h: &CudaBuffer, w: &MoeWeights<'_, CudaWeight>, p: &MoeParams, n_rows: usize, s: MoeBuffers<'_, CudaBuffer>, res: &mut CudaBuffer) -> Result<()> {
        let k = p.k;
        self.op_matmul(w.gate_inp, None, h, n_rows, s.router, false)?;
        self.op_moe_route(s.router, n_rows, p.n_expert, k, p.norm_w, p.w_scale, s.ids, s.weights)?;
        if w.gate_exps.host.is_some() {
            return self.moe_host_experts(h, w, p, n_rows, s, res);
        }
        self.moe_experts_on_gpu(h, w, p, n_rows, s, res)
    }

    /// The experts' FFN of `n_rows` routed rows (`s.ids`, `s.weights`) from device weights:
    /// `res += Σ_s w_s · FFN_{e_s}(h)`.
    pub(super) fn moe_experts_on_gpu(&self, h: &CudaBuffer, w: &MoeWeights<'_, CudaWeight>, p: &MoeParams, n_rows: usize, s: MoeBuffers<'_, CudaBuffer>, res: &mut CudaBuffer) -> Result<()> {
        let k = p.k;
        if n_rows <= gemv_max_rows() {
            self.op_matmul_id(&[w.gate_exps, w.up_exps], h, s.ids, n_rows, k, false, &mut [&mut *s.gate, &mut *s.up])?;
            self.op_swiglu(s.gate, s.up, n_rows * k * p.n_ff_exp)?;
            self.op_matmul_id(&[w.down_exps], s.gate, s.ids, n_rows, k, true, &mut [&mut *s.experts])?;
            return self.op_moe_combine(s.experts, s.weights, 0, n_rows, k, p.n_embd, res);
        }
        let n_pairs = n_rows * k;
        let (k_in, _, n_expert, _) = experts(w.gate_exps)?;
        if w.up_exps.wtype != w.gate_exps.wtype {
            return Err(FakError::Unsupported(format!("gate and up experts of different formats ({} / {})", w.gate_exps.wtype.name(), w.up_exps.wtype.name())));
        }
        let kform = is_kquant(w.gate_exps.wtype);
        let bn = tile_rows(n_pairs, n_expert);
        // every tile holds at least one pair
        let max_tiles = (n_pairs.div_ceil(bn) + n_expert).min(n_pairs);
        let ((sorted, pos, tiles), xs) = self.moe_scratch(n_pairs, max_tiles, k_in)?;
        self.launch(
            "moe",
            "moe_sort",
            (1, 1, 1),
            1024,
            (32 * n_expert * 4) as u32,
            Args::new().ptr(s.ids.ptr()).ptr(sorted).ptr(pos).ptr(tiles).i32(n_pairs as i32).i32(n_expert as i32).i32(bn as i32),
        )?;
        // The rows' 8-bit forms, gathered into the pairs' sorted order.
        self.ensure_q8(h, n_rows * k_in, kform)?;
        let [qs0, ds0, qsk, dk, sk] = h.q8_ptrs();
        let [oqs0, ods0, oqsk, odk, osk] = xs;
        let (src_q, dst_q) = if kform { (qsk, oqsk) } else { (qs0, oqs0) };
        self.launch(
            "moe",
            "moe_gather_q8",
            (n_pairs as u32, 1, 1),
            256,
            0,
            Args::new().ptr(sorted).i32(k as i32).i32(k_in as i32).i32(kform as i32).ptr(src_q).ptr(dk).ptr(sk).ptr(ds0).ptr(dst_q).ptr(odk).ptr(osk).ptr(ods0),
        )?;
        let a = if kform { (oqsk, odk, osk) } else { (oqs0, ods0, 0) };
        self.mmq_id(w.gate_exps, a, tiles, max_tiles, bn, s.gate)?;
        self.mmq_id(w.up_exps, a, tiles, max_tiles, bn, s.up)?;
        self.op_swiglu(s.gate, s.up, n_pairs * p.n_ff_exp)?;
        // The down projection reads the SwiGLU's 8-bit forms, already in sorted order.
        let (yq, ya, ys) = self.q8_operands(s.gate, n_pairs * p.n_ff_exp, is_kquant(w.down_exps.wtype))?;
        self.mmq_id(w.down_exps, (yq, ya, ys), tiles, max_tiles, bn, s.experts)?;
        self.op_moe_combine(s.experts, s.weights, pos, n_rows, k, p.n_embd, res)
    }
}
