//! Matrix multiplication against a GGUF-block weight (`rust/kernels/mmvq.cu`, `mmq.cu`,
//! `quantize.cu`):
//! - ≤ 8 rows (decode): the dp4a GEMV on the input's 8-bit form (`mmvq_kquant_q8_K_c<rows>` for
//!   Q4_K/Q5_K/Q6_K on the q8_K form, `mmvq_legacy_q8_0_c<rows>` for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0
//!   on the q8_0 form; both quantized bit-exactly as the CPU backend, by a fused producer or here by
//!   `quantize_f32_q8`), one launch for up to three matrices of the same input (Q/K/V, gate/up);
//!   `mmv_<fmt>_f32_c<rows>` for dense weights;
//! - more rows (prefill, batched decode): the int8 tensor-core GEMM `mmq_<fmt>_q8_n64` on the same
//!   CPU-faithful 8-bit activations (integer sub-block sums scaled as the CPU), or with
//!   `FAK_CUDA_MMQ=f16` (and for dense weights) the f16 tensor-core GEMM `mmq_<fmt>_f16_n<64|128>`.
//!
//! Bias is added in the kernels' epilogues, and so is the residual add of [`Backend::matmul_add`]
//! (`accumulate`: out += x·Wᵀ).
//!
//! [`Backend::matmul_add`]: crate::backend::Backend::matmul_add

use super::super::launch::Args;
use super::super::{intern, is_dense, kernel_fmt, CudaBackend, CudaBuffer, CudaWeight};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Rows up to which the GEMV runs (it is instantiated for 1..=8 activation rows).
pub const MMVQ_MAX_ROWS: usize = 8;

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
    fn ensure_q8(&self, x: &CudaBuffer, need: usize, kform: bool) -> Result<()> {
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
    fn q8_operands(&self, x: &CudaBuffer, need: usize, kform: bool) -> Result<(u64, u64, u64)> {
        self.ensure_q8(x, need, kform)?;
        let [qs0, ds0, qsk, dk, sk] = x.q8_ptrs();
        Ok(if kform { (qsk, dk, sk) } else { (qs0, ds0, 0) })
    }

    /// One GEMV launch over up to three quantized matrices of the same form and row length,
    /// `segs[i] = (weight, bias pointer, output pointer)`.
    fn gemv_quant(&self, segs: &[(&CudaWeight, u64, u64)], x: &CudaBuffer, n_rows: usize, accumulate: bool) -> Result<()> {
        debug_assert!(!segs.is_empty() && segs.len() <= 3);
        let k = segs[0].0.k();
        let kform = is_kquant(segs[0].0.wtype);
        let (yq, ya, ys) = self.q8_operands(x, n_rows * k, kform)?;
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
        if w.is_vector() {
            return Err(FakError::model(format!("tensor {} is a vector, not a matrix", w.name)));
        }
        let fmt = kernel_fmt(w.wtype).ok_or_else(|| FakError::Unsupported(format!("matmul with {} weights", w.wtype.name())))?;
        let bias_ptr = Self::bias_ptr(w, bias)?;
        if n_rows * k > x.len || n_rows * n_out > out.len {
            return Err(FakError::invalid("matmul", format!("{n_rows} rows of {k} → {n_out} exceed the buffers ({} / {})", x.len, out.len)));
        }
        out.written();
        if n_rows == 0 {
            return Ok(());
        }
        if n_rows <= MMVQ_MAX_ROWS {
            if is_dense(w.wtype) {
                let rpb = gemv_shape(k, n_out);
                let name = intern(format!("mmv_{fmt}_f32_c{n_rows}"));
                return self.launch(
                    "mmvq",
                    name,
                    (n_out.div_ceil(rpb) as u32, 1, 1),
                    128,
                    0,
                    Args::new()
                        .ptr(w.mem.ptr())
                        .u64(w.row_bytes as u64)
                        .ptr(x.ptr())
                        .ptr(bias_ptr)
                        .ptr(out.ptr())
                        .i32(k as i32)
                        .i32(n_out as i32)
                        .i32(rpb as i32)
                        .i32(accumulate as i32),
                );
            }
            return self.gemv_quant(&[(w, bias_ptr, out.ptr())], x, n_rows, accumulate);
        }
        if !is_dense(w.wtype) && !mmq_f16() {
            let kform = is_kquant(w.wtype);
            let (yq, ya, ys) = self.q8_operands(x, n_rows * k, kform)?;
            let name = intern(format!("mmq_{fmt}_q8_n64"));
            return self.launch(
                "mmq",
                name,
                (n_out.div_ceil(128) as u32, n_rows.div_ceil(64) as u32, 1),
                256,
                0,
                Args::new()
                    .ptr(w.mem.ptr())
                    .u64(w.row_bytes as u64)
                    .ptr(yq)
                    .ptr(ya)
                    .ptr(ys)
                    .ptr(bias_ptr)
                    .ptr(out.ptr())
                    .i32(k as i32)
                    .i32(n_out as i32)
                    .i32(n_rows as i32)
                    .i32(accumulate as i32),
            );
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

    /// Several matrices of the same input: one GEMV launch for each run of up to three quantized
    /// matrices of the same activation form and row length (decode), else one op each.
    pub(crate) fn op_matmul_multi(&self, ws: &[(&CudaWeight, Option<&CudaWeight>)], x: &CudaBuffer, n_rows: usize, outs: &mut [&mut CudaBuffer]) -> Result<()> {
        let fusable = (1..=MMVQ_MAX_ROWS).contains(&n_rows)
            && ws.iter().all(|(w, _)| !w.is_vector() && !is_dense(w.wtype) && kernel_fmt(w.wtype).is_some())
            && ws.iter().all(|(w, _)| w.k() == ws[0].0.k() && is_kquant(w.wtype) == is_kquant(ws[0].0.wtype));
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
