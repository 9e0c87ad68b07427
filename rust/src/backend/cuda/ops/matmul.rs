//! Matrix multiplication against a GGUF-block weight (`rust/kernels/mmvq.cu`, `mmq.cu`,
//! `quantize.cu`). The kernel for a quantized product is chosen per `(format, rows, k, n_out)`
//! by [`super::matmul_plan`] (a measured table, a heuristic where it has no entry):
//! - the dp4a GEMV on the input's 8-bit form (`mmvq_kquant_q8_K_c<rows>` for Q4_K/Q5_K/Q6_K on
//!   the q8_K form, `mmvq_legacy_q8_0_c<rows>` for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 on the q8_0 form;
//!   both quantized bit-exactly as the CPU backend, by a fused producer or here by
//!   `quantize_f32_q8`), up to 8 rows per launch (more rows in launches of 8), one launch for up
//!   to three matrices of the same input (Q/K/V, gate/up); `mmv_<fmt>_f32_c<rows>` for dense
//!   weights (≤ 8 rows);
//! - the int8 tensor-core GEMM `mmq_<fmt>_q8_n<16|32|64>_p<1|2>` on the same CPU-faithful 8-bit
//!   activations (integer sub-block sums scaled as the CPU): small token tiles and split-K for
//!   batched decode, 64-token tiles for prefill; or with `FAK_CUDA_MMQ=f16` (and for dense weights
//!   above 8 rows) the f16 tensor-core GEMM `mmq_<fmt>_f16_n<64|128>`.
//!
//! Bias is added in the kernels' epilogues, and so is the residual add of [`Backend::matmul_add`]
//! (`accumulate`: out += x·Wᵀ).
//!
//! [`Backend::matmul_add`]: crate::backend::Backend::matmul_add

use super::super::launch::Args;
use super::super::{intern, is_dense, kernel_fmt, AttnScratch, CudaBackend, CudaBuffer, CudaWeight, MEMORY};
use super::matmul_plan::{self, Choice, Mode, Tc};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Rows up to which the GEMV runs in one launch (it is instantiated for 1..=8 activation rows).
pub const MMVQ_MAX_ROWS: usize = matmul_plan::GEMV_MAX_ROWS;

/// Arrival counters of the split-K GEMM (one per output tile of a launch; a launch with more
/// tiles runs unsplit).
pub(crate) const MM_COUNTERS: usize = 1 << 16;

/// Dynamic shared memory of `mmq_<fmt>_q8_n<BN>_p<G>`: the double-buffered int8 weight tiles of G
/// k-steps (128 rows × 48 bytes each); of `mmq_<fmt>_q8_n<BN>_s<S>` (G = 2), also its S stages;
/// of `mmq_<fmt>_q8_n<BN>_f<S>` (`frag`: no int8 tiles), the stages alone. Bytes.
pub(crate) fn mmq_q8_smem(g: usize, stages: usize, wtype: GgmlType, bn: usize, frag: bool) -> u32 {
    let tiles = if frag { 0 } else { 2 * g * 128 * 48 };
    (tiles + stages * stage_bytes(wtype, bn)) as u32
}

/// Bytes of one stage of the staged GEMM, as `stage_bytes<FMT, BN>` of `rust/kernels/mmq.cu`
/// lays it out: 128 weight rows of 256 values (the format's blocks: 256 / block size × type
/// size bytes) at the kernel's row stride (an odd number of 16-byte units; Q6_K's 4-byte-copied
/// rows 232), then per token 272 bytes of quants, its scales (16 bytes for the q8_K form, 64 for
/// the q8_0 form) and, for Q4_K/Q5_K, 32 bytes of block sums.
fn stage_bytes(wtype: GgmlType, bn: usize) -> usize {
    let bps = 256 / wtype.block_size() * wtype.type_size();
    let rs = match wtype {
        GgmlType::Q6_K => 232,
        _ if (bps / 16) % 2 == 1 => bps,
        _ => bps + 16,
    };
    let ya = if is_kquant(wtype) { 16 } else { 64 };
    let ys = if matches!(wtype, GgmlType::Q4_K | GgmlType::Q5_K) { 32 } else { 0 };
    128 * rs + bn * (272 + ya + ys)
}

/// Static shared memory the GEMM kernels may use besides the dynamic part (ptxas reports ≤ 21 KB
/// for the staged ones; a launch whose total would pass the device's opt-in limit takes fewer
/// stages).
const MMQ_STATIC_SMEM: usize = 24 << 10;

/// Largest split-K workspace (partial sums) a product may use; beyond it the split count drops.
const MM_WS_MAX: usize = 256 << 20;

/// `FAK_CUDA_MMQ=f16`: prefill on the previous f16 tensor-core GEMM (weights dequantized to f16,
/// activations rounded to f16) instead of the CPU-faithful int8 one.
pub(crate) fn mmq_f16() -> bool {
    static F16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F16.get_or_init(|| std::env::var("FAK_CUDA_MMQ").as_deref() == Ok("f16"))
}

/// Whether a weight format reads the q8_K form (the k-quants) rather than the q8_0 form.
fn is_kquant(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// `(warps per row, rows per 128-thread block)` of the GEMV: a long row is split across warps so
/// that each warp keeps several 32-value tasks in flight; small matrices get one row per block,
/// for more blocks.
fn gemv_shape(k: usize, n_out: usize) -> usize {
    let tasks = k / 32;
    let wpr = if tasks >= 256 {
        4
    } else if tasks >= 128 {
        2
    } else {
        1
    };
    if n_out < 1024 {
        1
    } else {
        4 / wpr
    }
}

/// `FAK_CUDA_GEMV_HALF=0`: no half-warp rows in the quantized GEMV (see [`gemv_shape_q`]).
fn gemv_half() -> bool {
    static HALF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HALF.get_or_init(|| std::env::var("FAK_CUDA_GEMV_HALF").as_deref() != Ok("0"))
}

/// [`gemv_shape`] for the quantized GEMV, which also runs rows of 33..63 tasks of 32 weights
/// (K = 1056..2016, e.g. 1536) on half a warp each, 8 rows per block (`8`): 48 tasks on 16 lanes
/// are 3 each, where 32 lanes would take 2 on half of them and 1 on the rest.
fn gemv_shape_q(k: usize, n_out: usize) -> usize {
    let tasks = k / 32;
    if gemv_half() && tasks > 32 && tasks < 64 && n_out >= 1024 {
        8
    } else {
        gemv_shape(k, n_out)
    }
}

/// Rows above which F32-weight products (a MoE router: 2048 → 128 on the 30B-A3B) run the f32
/// GEMM (`sgemm_f32`) instead of the GEMV over chunks of 8 rows. The GEMM's blocks of 64 rows ×
/// 64 outputs step through K one global load at a time: on a router it is latency-bound at
/// ≈ 180–240 µs per product from 16 to 8,192 rows (H100, 2026-12-07), where the GEMV in
/// launches of 8 rows cost ≈ 4.2 µs per launch (with the GEMM from 9 rows on, decode at 16 / 64 /
/// 128 sequences fell from 955 / 2,198 / 3,666 to 639 / 1,762 / 3,236 tok/s, and an 8192-token
/// prefill's routers went from 277 ms in 48,128 launches to 11 ms). The GEMV reads a chunk's
/// activations once per output row, so its traffic grows with rows × outputs: the GEMM takes
/// the long prompts.
pub const SGEMM_MIN_ROWS: usize = 2048;

impl CudaBackend {
    fn bias_ptr(w: &CudaWeight, bias: Option<&CudaWeight>) -> Result<u64> {
        let n_out = w.n_out();
        match bias {
            Some(b) if b.wtype == GgmlType::F32 && b.k() == n_out => Ok(b.mem.ptr()),
            Some(b) => Err(FakError::model(format!("bias {} must be a vector of {n_out} values", b.name))),
            None => Ok(0),
        }
    }

    /// Makes sure `x` holds the 8-bit form (q8_K when `kform`, else q8_0) of its first `need`
    /// elements, quantizing them here when no fused producer wrote it.
    pub(crate) fn ensure_q8(&self, x: &CudaBuffer, need: usize, kform: bool) -> Result<()> {
        let have = if kform { x.q8k_len.get() } else { x.q8_len.get() };
        if have >= need {
            return Ok(());
        }
        let [qs0, ds0, qsk, dk, sk] = x.q8_ptrs();
        // One warp per chunk of 256 values, 8 warps per block.
        let blocks = need.div_ceil(2048).clamp(1, 8192) as u32;
        self.launch(
            "quantize",
            "quantize_f32_q8",
            (blocks, 1, 1),
            256,
            0,
            Args::new().ptr(x.ptr()).ptr(qs0).ptr(ds0).ptr(qsk).ptr(dk).ptr(sk).i32(need as i32),
        )?;
        x.set_q8(need, need.is_multiple_of(256));
        Ok(())
    }

    /// The kernels' activation operands `(quants, scales, block sums)` of `x`'s first `need`
    /// values in the q8_K form (`kform`; block sums of 32) or the q8_0 form (scale and scaled sum
    /// pairs; no separate sums: 0), quantized first when needed ([`Self::ensure_q8`]).
    pub(crate) fn q8_operands(&self, x: &CudaBuffer, need: usize, kform: bool) -> Result<(u64, u64, u64)> {
        self.ensure_q8(x, need, kform)?;
        let [qs0, ds0, qsk, dk, sk] = x.q8_ptrs();
        Ok(if kform { (qsk, dk, sk) } else { (qs0, ds0, 0) })
    }

    /// GEMV launches over up to three quantized matrices of the same form and row length,
    /// `segs[i] = (weight, bias pointer, output pointer)`: rows `r0..r0 + n` per launch, up to
    /// [`MMVQ_MAX_ROWS`] at a time.
    fn gemv_quant(&self, segs: &[(&CudaWeight, u64, u64)], x: &CudaBuffer, n_rows: usize, accumulate: bool) -> Result<()> {
        debug_assert!(!segs.is_empty() && segs.len() <= 3);
        let k = segs[0].0.k();
        let kform = is_kquant(segs[0].0.wtype);
        let (yq, ya, ys) = self.q8_operands(x, n_rows * k, kform)?;
        let mut r0 = 0;
        while r0 < n_rows {
            let n = (n_rows - r0).min(MMVQ_MAX_ROWS);
            // Row r0's operands: quants K bytes a row; q8_K: K/256 f32 scales and K/32 i32 sums a
            // row; q8_0: K/32 (f32, f32) pairs a row.
            let (q, a, sm) = if kform {
                (yq + (r0 * k) as u64, ya + (r0 * (k / 256) * 4) as u64, ys + (r0 * (k / 32) * 4) as u64)
            } else {
                (yq + (r0 * k) as u64, ya + (r0 * (k / 32) * 8) as u64, 0)
            };
            let shifted: Vec<(&CudaWeight, u64, u64)> = segs.iter().map(|&(w, b, d)| (w, b, d + (r0 * w.n_out() * 4) as u64)).collect();
            self.gemv_launch(&shifted, (q, a, sm), k, kform, n, accumulate)?;
            r0 += n;
        }
        Ok(())
    }

    /// One GEMV launch of `n_rows` (≤ 8) rows whose operands are `(yq, ya, ys)`.
    fn gemv_launch(&self, segs: &[(&CudaWeight, u64, u64)], (yq, ya, ys): (u64, u64, u64), k: usize, kform: bool, n_rows: usize, accumulate: bool) -> Result<()> {
        let mut args = Args::new();
        let mut end = 0usize;
        let total: usize = segs.iter().map(|(w, _, _)| w.n_out().div_ceil(gemv_shape_q(k, w.n_out()))).sum();
        for i in 0..3 {
            match segs.get(i) {
                Some(&(w, bias, dst)) => {
                    let rpb = gemv_shape_q(k, w.n_out());
                    end += w.n_out().div_ceil(rpb);
                    args = args.ptr(w.mem.ptr()).u64(w.row_bytes as u64).ptr(bias).ptr(dst).i32(w.n_out() as i32).i32(rpb as i32).i32(w.wtype as i32);
                }
                None => args = args.ptr(0).u64(0).ptr(0).ptr(0).i32(0).i32(1).i32(0),
            }
            if i < 2 {
                // Block ends of segments 0 and 1 (a missing segment ends where the last one did).
                args = args.i32(end as i32);
            }
        }
        args = args.ptr(yq).ptr(ya).ptr(ys).i32(k as i32).i32(accumulate as i32);
        let name = intern(format!("mmvq_{}_c{n_rows}", if kform { "kquant_q8_K" } else { "legacy_q8_0" }));
        self.launch("mmvq", name, (total as u32, 1, 1), 128, 0, args)
    }

    /// `out = x·Wᵀ (+ bias)`, or `out += x·Wᵀ (+ bias)` when `accumulate`.
    pub(crate) fn op_matmul(&self, w: &CudaWeight, bias: Option<&CudaWeight>, x: &CudaBuffer, n_rows: usize, out: &mut CudaBuffer, accumulate: bool) -> Result<()> {
        let (k, n_out) = (w.k(), w.n_out());
        // An f32 vector `[k]` is one output row (a shared expert's gate `ffn_gate_inp_shexp`, 1-D
        // in the hybrids' files, as on the CPU).
        if w.is_vector() && w.wtype != GgmlType::F32 {
            return Err(FakError::model(format!("tensor {} is a vector, not a matrix", w.name)));
        }
        let fmt = kernel_fmt(w.wtype).ok_or_else(|| FakError::Unsupported(format!("matmul with {} weights", w.wtype.name())))?;
        if k % 32 != 0 {
            return Err(FakError::Unsupported(format!("CUDA matmul of {} with rows of {k} (a multiple of 32 is needed)", w.name)));
        }
        let bias_ptr = Self::bias_ptr(w, bias)?;
        if n_rows * k > x.len || n_rows * n_out > out.len {
            return Err(FakError::invalid("matmul", format!("{n_rows} rows of {k} → {n_out} exceed the buffers ({} / {})", x.len, out.len)));
        }
        out.written();
        if n_rows == 0 {
            return Ok(());
        }
        // F32 weights (a MoE router: its top-k must not see f16 rounding) on many rows: the f32
        // SIMT GEMM (`sgemm.cu`); on fewer, the GEMV over chunks of 8 rows (below).
        if w.wtype == GgmlType::F32 && n_rows > SGEMM_MIN_ROWS {
            return self.launch(
                "sgemm",
                "sgemm_f32",
                (n_out.div_ceil(64) as u32, n_rows.div_ceil(64) as u32, 1),
                256,
                0,
                Args::new()
                    .ptr(w.mem.ptr())
                    .ptr(x.ptr())
                    .ptr(bias_ptr)
                    .ptr(out.ptr())
                    .i32(k as i32)
                    .i32(n_out as i32)
                    .i32(n_rows as i32)
                    .i32(accumulate as i32),
            );
        }
        // Dense weights on few rows: the f32 GEMV; F32 weights on up to SGEMM_MIN_ROWS rows: the
        // GEMV over chunks of 8 rows in one launch (grid.y), the rest in a second.
        if is_dense(w.wtype) && (n_rows <= MMVQ_MAX_ROWS || w.wtype == GgmlType::F32) {
            let rpb = gemv_shape(k, n_out);
            let full = n_rows / MMVQ_MAX_ROWS;
            let rest = n_rows % MMVQ_MAX_ROWS;
            for (r0, nc, chunks) in [(0, MMVQ_MAX_ROWS, full), (full * MMVQ_MAX_ROWS, rest, 1)] {
                if nc == 0 || chunks == 0 {
                    continue;
                }
                let name = intern(format!("mmv_{fmt}_f32_c{nc}"));
                self.launch(
                    "mmvq",
                    name,
                    (n_out.div_ceil(rpb) as u32, chunks as u32, 1),
                    128,
                    0,
                    Args::new()
                        .ptr(w.mem.ptr())
                        .u64(w.row_bytes as u64)
                        .ptr(x.ptr() + (r0 * k * 4) as u64)
                        .ptr(bias_ptr)
                        .ptr(out.ptr() + (r0 * n_out * 4) as u64)
                        .i32(k as i32)
                        .i32(n_out as i32)
                        .i32(rpb as i32)
                        .i32(accumulate as i32),
                )?;
            }
            return Ok(());
        }
        if !is_dense(w.wtype) && (n_rows <= MMVQ_MAX_ROWS || !mmq_f16()) {
            return match matmul_plan::choose(w.wtype, k, n_out, n_rows, self.dev.info.n_sm.max(1) as usize, self.decode_mode()) {
                Choice::Gemv => self.gemv_quant(&[(w, bias_ptr, out.ptr())], x, n_rows, accumulate),
                Choice::Tc(t) => self.gemm_q8(w, bias_ptr, x, n_rows, out.ptr(), accumulate, t),
            };
        }
        let bn = if n_rows <= 64 { 64 } else { 128 };
        let name = intern(format!("mmq_{fmt}_f16_n{bn}"));
        self.launch(
            "mmq",
            name,
            (n_out.div_ceil(128) as u32, n_rows.div_ceil(bn) as u32, 1),
            256,
            0,
            Args::new()
                .ptr(w.mem.ptr())
                .u64(w.row_bytes as u64)
                .ptr(x.ptr())
                .ptr(bias_ptr)
                .ptr(out.ptr())
                .i32(k as i32)
                .i32(n_out as i32)
                .i32(n_rows as i32)
                .i32(accumulate as i32),
        )
    }

    /// Whether the products now run in a decode step (see [`matmul_plan`]).
    fn decode_mode(&self) -> bool {
        self.decode_step.load(std::sync::atomic::Ordering::Relaxed) || matmul_plan::decode_forced()
    }

    /// The split-K partial sums: at least `bytes`, never shrunk (old ones stay alive for graphs
    /// captured with them).
    fn mm_workspace(&self, bytes: usize) -> Result<u64> {
        let mut g = self.mm.lock().unwrap_or_else(|e| e.into_inner());
        let s: &mut AttnScratch = &mut g;
        if s.ws_bytes < bytes {
            let t = self.alloc_tracked(bytes, &MEMORY.activations)?;
            if let Some(old) = s.ws.replace(t) {
                s.old.push(old);
            }
            s.ws_bytes = bytes;
        }
        Ok(s.ws.as_ref().expect("allocated above").ptr())
    }

    /// Whether the staged (`frag`: fragment) GEMM of `stages` stages and `bn`-token tiles fits the
    /// device's opt-in shared memory with the kernels' static part ([`MMQ_STATIC_SMEM`]).
    pub(crate) fn mmq_q8_fits(&self, stages: usize, wtype: GgmlType, bn: usize, frag: bool) -> bool {
        mmq_q8_smem(2, stages, wtype, bn, frag) as usize + MMQ_STATIC_SMEM <= self.dev.info.max_smem_optin as usize
    }

    /// The int8 tensor-core GEMM `dst (+)= x·Wᵀ (+ bias)` with launch shape `t`.
    #[allow(clippy::too_many_arguments)]
    fn gemm_q8(&self, w: &CudaWeight, bias_ptr: u64, x: &CudaBuffer, n_rows: usize, dst: u64, accumulate: bool, t: Tc) -> Result<()> {
        let (k, n_out) = (w.k(), w.n_out());
        let fmt = kernel_fmt(w.wtype).ok_or_else(|| FakError::Unsupported(format!("matmul with {} weights", w.wtype.name())))?;
        let kform = is_kquant(w.wtype);
        let (yq, ya, ys) = self.q8_operands(x, n_rows * k, kform)?;
        let steps = k / 32;
        let (gx, gy) = (n_out.div_ceil(128), n_rows.div_ceil(t.bn));
        let (mut kps, mut splits) = matmul_plan::split_k(steps, t.splits);
        let (mut ws, mut cnt) = (0u64, 0u64);
        if splits > 1 {
            let bytes = splits * n_rows * n_out * 4;
            if gx * gy > MM_COUNTERS || bytes > MM_WS_MAX {
                splits = 1;
            } else {
                ws = self.mm_workspace(bytes)?;
                cnt = self.mm_counters.ptr();
            }
        }
        if splits == 1 {
            kps = steps.max(1);
        }
        // The staged modes need whole stages of 256 values and the shared memory for them (else
        // fewer stages, else the direct mode); the fragment mode exists for Q4_K and Q6_K (the
        // others run the staged mode).
        let (mut stages, frag, depth) = match t.mode {
            Mode::Direct { depth } => (0, false, depth),
            Mode::Staged { stages } => (stages, false, 2),
            Mode::Fragment { stages } => (stages, matches!(w.wtype, GgmlType::Q4_K | GgmlType::Q6_K), 2),
        };
        if !k.is_multiple_of(256) {
            stages = 0;
        }
        let fits = |s: usize| self.mmq_q8_fits(s, w.wtype, t.bn, frag);
        while stages > 2 && !fits(stages) {
            stages -= 1;
        }
        if stages > 0 && !fits(stages) {
            stages = 0;
        }
        let (name, smem) = if stages > 0 {
            let mode = if frag { "f" } else { "s" };
            (intern(format!("mmq_{fmt}_q8_n{}_{mode}{stages}", t.bn)), mmq_q8_smem(2, stages, w.wtype, t.bn, frag))
        } else {
            (intern(format!("mmq_{fmt}_q8_n{}_p{depth}", t.bn)), mmq_q8_smem(depth, 0, w.wtype, t.bn, false))
        };
        self.launch(
            "mmq",
            name,
            (gx as u32, gy as u32, splits as u32),
            256,
            smem,
            Args::new()
                .ptr(w.mem.ptr())
                .u64(w.row_bytes as u64)
                .ptr(yq)
                .ptr(ya)
                .ptr(ys)
                .ptr(bias_ptr)
                .ptr(dst)
                .i32(k as i32)
                .i32(n_out as i32)
                .i32(n_rows as i32)
                .i32(accumulate as i32)
                .i32(kps as i32)
                .ptr(ws)
                .ptr(cnt),
        )
    }

    /// Several matrices of the same input: one GEMV launch for each run of up to three quantized
    /// matrices of the same activation form and row length (decode), else one op each.
    pub(crate) fn op_matmul_multi(&self, ws: &[(&CudaWeight, Option<&CudaWeight>)], x: &CudaBuffer, n_rows: usize, outs: &mut [&mut CudaBuffer]) -> Result<()> {
        let n_sm = self.dev.info.n_sm.max(1) as usize;
        let fusable = n_rows > 0
            && ws.iter().all(|(w, _)| !w.is_vector() && !is_dense(w.wtype) && kernel_fmt(w.wtype).is_some())
            && ws.iter().all(|(w, _)| w.k() == ws[0].0.k() && is_kquant(w.wtype) == is_kquant(ws[0].0.wtype))
            && ws.iter().all(|(w, _)| matmul_plan::choose(w.wtype, w.k(), w.n_out(), n_rows, n_sm, self.decode_mode()) == Choice::Gemv);
        if !fusable {
            for ((w, b), out) in ws.iter().zip(outs.iter_mut()) {
                self.op_matmul(w, *b, x, n_rows, out, false)?;
            }
            return Ok(());
        }
        let k = ws[0].0.k();
        if n_rows * k > x.len {
            return Err(FakError::invalid("matmul", format!("{n_rows} rows of {k} exceed the input buffer ({})", x.len)));
        }
        let mut segs = Vec::with_capacity(ws.len());
        for ((w, b), out) in ws.iter().zip(outs.iter_mut()) {
            if n_rows * w.n_out() > out.len {
                return Err(FakError::invalid("matmul", format!("{n_rows} rows of {} exceed the output buffer ({})", w.n_out(), out.len)));
            }
            out.written();
            segs.push((*w, Self::bias_ptr(w, *b)?, out.ptr()));
        }
        for chunk in segs.chunks(3) {
            self.gemv_quant(chunk, x, n_rows, false)?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// Seconds one product `x[..n_rows]·Wᵀ` takes on the GPU, for each case `(n_rows, choice)`
    /// (`None`: the table's choice): `iters` products captured in one CUDA graph (as a decode
    /// step runs them), the graph replayed `reps` times, the median replay over `iters`. `x` holds
    /// the largest case's rows; its 8-bit form is computed once before (in a forward a fused
    /// producer writes it). The weight is uploaded once for all cases. For
    /// `benches/bench_cuda_matmul.py`.
    ///
    /// Errors: [`FakError::InvalidArgument`] when `w` or `x` do not match the shapes; backend
    /// errors.
    #[allow(clippy::too_many_arguments)]
    pub fn time_matmul(&self, wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], cases: &[(usize, Option<Choice>)], iters: usize, reps: usize) -> Result<Vec<f64>> {
        use crate::backend::{Backend, HostTensor};
        let max_rows = x.len() / k.max(1);
        if max_rows * k != x.len() || cases.iter().any(|&(r, _)| r == 0 || r > max_rows) {
            return Err(FakError::invalid("x", format!("{} values are not the {} rows of {k} the cases need", x.len(), cases.iter().map(|c| c.0).max().unwrap_or(0))));
        }
        let owner: std::sync::Arc<Vec<u8>> = std::sync::Arc::new(w.to_vec());
        let dims = [k, n_out];
        let t = HostTensor { name: "w", wtype, dims: &dims, data: owner.as_slice(), owner: owner.clone() };
        let wt = self.load_weight(&t)?;
        let xb = self.upload_buffer(x)?;
        let mut out = self.alloc_buffer(max_rows * n_out)?;
        let mut res = Vec::with_capacity(cases.len());
        for &(n_rows, choice) in cases {
            matmul_plan::force(choice);
            let r = (|| -> Result<f64> {
                self.op_matmul(&wt, None, &xb, n_rows, &mut out, false)?;
                self.dev.synchronize()?;
                let exec = super::super::graph::capture(&self.dev, &mut || {
                    for _ in 0..iters.max(1) {
                        self.op_matmul(&wt, None, &xb, n_rows, &mut out, false)?;
                    }
                    Ok(())
                })?;
                exec.launch(&self.dev)?;
                self.dev.synchronize()?;
                let mut times = Vec::with_capacity(reps.max(1));
                for _ in 0..reps.max(1) {
                    let t0 = std::time::Instant::now();
                    exec.launch(&self.dev)?;
                    self.dev.synchronize()?;
                    times.push(t0.elapsed().as_secs_f64() / iters.max(1) as f64);
                }
                times.sort_by(f64::total_cmp);
                Ok(times[times.len() / 2])
            })();
            matmul_plan::force(None);
            res.push(r?);
        }
        Ok(res)
    }
}
