//! Quantized matrix multiplication on CPU: `y = x · Wᵀ` with `W` kept in its GGUF blocks (never
//! widened to f32), activations quantized to the format's ggml `vec_dot_type` exactly as llama.cpp
//! does, SIMD chosen at run time (AVX-512 VNNI, AVX2, scalar), threads from the caller's rayon pool.
//!
//! Sources: ggml `ggml-common.h` (block layouts), ggml-cpu `quants.c` / `arch/x86/quants.c`
//! (activation quantizers and the integer structure of `ggml_vec_dot_*`), ggml-cpu `vec.cpp`
//! (f32/f16/bf16 dot products).
//!
//! Layout of the work: the output columns (`n_out`, weight rows) are split into chunks run as rayon
//! tasks; inside a chunk the activation rows are walked in groups of up to [`MAX_ROWS`] and each
//! weight row is decoded once per group and dotted with every row of the group, so a prefill
//! (`n_rows` large) loads each weight block once per group instead of once per token, while a
//! decode (`n_rows` = 1..4) is one sequential pass over the weights.

mod act;
mod blocks;
mod scalar;
mod simd;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

pub use act::{BlockQ8K, BlockQ8_0, BlockQ8_1};
pub use simd::{available_levels, detected_level, SimdLevel};

use crate::quant::GgmlType;
use crate::{FakError, Result};
use rayon::prelude::*;

/// Activation rows a kernel call handles at once (the prefill micro-tile height).
pub const MAX_ROWS: usize = 4;

/// Computes `out[r] = W_row · a_row(r)` for `r < nr` (`nr` ≤ [`MAX_ROWS`]), where the weight row
/// starts at `w` and holds `nb` blocks (elements for the float formats) and activation row `r`
/// starts at `a + r·a_stride` (in units of `A`).
///
/// # Safety
/// `w` must point to a whole weight row, each activation row to `nb` valid `A`s, `out` to `nr`
/// floats, and the CPU must support the instructions of the kernel's level.
pub(crate) type Kernel<A> = unsafe fn(w: *const u8, a: *const A, a_stride: usize, nb: usize, nr: usize, out: *mut f32);

/// The name of the SIMD path [`matmul`] runs on this machine (`"avx512"`, `"avx2"` or `"scalar"`),
/// after any `FAK_CPU_SIMD` override.
pub fn simd_level() -> &'static str {
    simd::active_level().name()
}

/// `y[r·n_out + o] = Σ_i W[o, i] · x[r·k + i]` for `r < n_rows`, `o < n_out`.
///
/// `w` holds `n_out` rows of `k` elements of type `wtype` as GGUF blocks (row-major, each row
/// `k / block_size` blocks, exactly `n_out · row_bytes` bytes); `x` is `[n_rows, k]` f32 and `y`
/// `[n_rows, n_out]` f32 (overwritten). Activations are quantized like llama.cpp's CPU backend:
/// Q8_K for the k-quants, Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, F16 for F16 weights, BF16
/// for BF16 weights, none for F32. Runs on the current rayon pool.
///
/// Errors: [`FakError::Unsupported`] for a type without a kernel; [`FakError::InvalidArgument`] when
/// `k` is not a multiple of the block size or a slice length does not match the shape.
pub fn matmul(wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize, y: &mut [f32]) -> Result<()> {
    matmul_at(simd::active_level(), wtype, w, n_out, k, x, n_rows, y)
}

/// [`matmul`] on an explicit SIMD level (for tests and benches); a level above what this CPU
/// supports is an [`FakError::InvalidArgument`].
#[allow(clippy::too_many_arguments)]
pub fn matmul_at(level: SimdLevel, wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize, y: &mut [f32]) -> Result<()> {
    if level > simd::detected_level() {
        return Err(FakError::invalid("level", format!("{} is not supported by this CPU", level.name())));
    }
    let (bs, ts) = wtype.block_geometry();
    let plan = plan(wtype, level)
        .ok_or_else(|| FakError::Unsupported(format!("matmul with {} weights", wtype.name())))?;
    if k % bs != 0 {
        return Err(FakError::invalid("k", format!("{k} is not a multiple of the {} block size {bs}", wtype.name())));
    }
    let nb = k / bs;
    let row_bytes = nb * ts;
    let w_len = n_out.checked_mul(row_bytes).ok_or_else(|| FakError::invalid("n_out", "shape overflows"))?;
    if w.len() != w_len {
        return Err(FakError::invalid("w", format!("{} bytes given, {n_out} rows of {k} {} need {w_len}", w.len(), wtype.name())));
    }
    let x_len = n_rows.checked_mul(k).ok_or_else(|| FakError::invalid("n_rows", "shape overflows"))?;
    if x.len() != x_len {
        return Err(FakError::invalid("x", format!("{} floats given, [{n_rows}, {k}] needs {x_len}", x.len())));
    }
    let y_len = n_rows.checked_mul(n_out).ok_or_else(|| FakError::invalid("n_rows", "shape overflows"))?;
    if y.len() != y_len {
        return Err(FakError::invalid("y", format!("{} floats given, [{n_rows}, {n_out}] needs {y_len}", y.len())));
    }
    if n_rows == 0 || n_out == 0 {
        return Ok(());
    }
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    let shape = Shape { n_out, nb, row_bytes, n_rows };
    match plan {
        Plan::Q8_0(kern) => {
            let a = quantize_rows(x, k, QK8_BLOCK, act::quantize_row_q8_0);
            drive(kern, w, &a, nb, shape, y);
        }
        Plan::Q8_1(kern) => {
            let a = quantize_rows(x, k, QK8_BLOCK, act::quantize_row_q8_1);
            drive(kern, w, &a, nb, shape, y);
        }
        Plan::Q8K(kern) => {
            let a = quantize_rows(x, k, act::QK_K, act::quantize_row_q8_k);
            drive(kern, w, &a, nb, shape, y);
        }
        Plan::F32(kern) => drive(kern, w, x, k, shape, y),
        Plan::F16(kern) => {
            let a = quantize_rows(x, k, 1, |x, o: &mut [u16]| o.iter_mut().zip(x).for_each(|(o, &v)| *o = blocks::f32_to_f16_bits(v)));
            drive(kern, w, &a, k, shape, y);
        }
        Plan::BF16(kern) => {
            let a = quantize_rows(x, k, 1, |x, o: &mut [u16]| o.iter_mut().zip(x).for_each(|(o, &v)| *o = blocks::f32_to_bf16_bits(v)));
            drive(kern, w, &a, k, shape, y);
        }
    }
    Ok(())
}

/// Quantizes the activations `x` (`[n_rows, k]`) to a format's ggml `vec_dot_type` and returns the
/// blocks in ggml's byte layout, row after row (for tests: `"Q8_0"`, `"Q8_1"`, `"Q8_K"`).
pub fn quantize_activations(vec_dot_type: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    match vec_dot_type {
        GgmlType::Q8_0 | GgmlType::Q8_1 if x.len() % QK8_BLOCK != 0 => {
            Err(FakError::invalid("x", format!("length {} is not a multiple of 32", x.len())))
        }
        GgmlType::Q8_K if x.len() % act::QK_K != 0 => {
            Err(FakError::invalid("x", format!("length {} is not a multiple of 256", x.len())))
        }
        GgmlType::Q8_0 => {
            x.chunks_exact(QK8_BLOCK).for_each(|c| act::quantize_block_q8_0(c).to_ggml_bytes(&mut out));
            Ok(out)
        }
        GgmlType::Q8_1 => {
            x.chunks_exact(QK8_BLOCK).for_each(|c| act::quantize_block_q8_1(c).to_ggml_bytes(&mut out));
            Ok(out)
        }
        GgmlType::Q8_K => {
            x.chunks_exact(act::QK_K).for_each(|c| act::quantize_block_q8_k(c).to_ggml_bytes(&mut out));
            Ok(out)
        }
        t => Err(FakError::Unsupported(format!("activation quantization to {}", t.name()))),
    }
}

const QK8_BLOCK: usize = act::QK8;

/// The kernel for a weight type at a level, tagged with its activation type.
enum Plan {
    Q8_0(Kernel<BlockQ8_0>),
    Q8_1(Kernel<BlockQ8_1>),
    Q8K(Kernel<BlockQ8K>),
    F32(Kernel<f32>),
    F16(Kernel<u16>),
    BF16(Kernel<u16>),
}

fn plan(t: GgmlType, level: SimdLevel) -> Option<Plan> {
    #[cfg(target_arch = "x86_64")]
    {
        let p = match level {
            SimdLevel::Avx512 => avx512::plan(t),
            SimdLevel::Avx2 => avx2::plan(t),
            SimdLevel::Scalar => None,
        };
        if p.is_some() {
            return p;
        }
        // A level without its own kernel for `t` runs the next lower level's.
        if level == SimdLevel::Avx512 {
            if let Some(p) = avx2::plan(t) {
                return Some(p);
            }
        }
    }
    let _ = level;
    scalar_plan(t)
}

/// Wraps a safe scalar row dot product into a [`Kernel`].
macro_rules! scalar_kernel {
    ($name:ident, $dot:path, $a:ty, $wbytes:expr) => {
        unsafe fn $name(w: *const u8, a: *const $a, a_stride: usize, nb: usize, nr: usize, out: *mut f32) {
            // SAFETY: the caller guarantees a whole weight row and `nr` activation rows of `nb`.
            unsafe {
                let ws = std::slice::from_raw_parts(w, nb * $wbytes);
                for r in 0..nr {
                    let ar = std::slice::from_raw_parts(a.add(r * a_stride), nb);
                    *out.add(r) = $dot(ws, ar);
                }
            }
        }
    };
}

scalar_kernel!(k_q4_0, scalar::dot_q4_0, BlockQ8_0, blocks::q4_0::BYTES);
scalar_kernel!(k_q4_1, scalar::dot_q4_1, BlockQ8_1, blocks::q4_1::BYTES);
scalar_kernel!(k_q5_0, scalar::dot_q5_0, BlockQ8_0, blocks::q5_0::BYTES);
scalar_kernel!(k_q5_1, scalar::dot_q5_1, BlockQ8_1, blocks::q5_1::BYTES);
scalar_kernel!(k_q8_0, scalar::dot_q8_0, BlockQ8_0, blocks::q8_0::BYTES);
scalar_kernel!(k_q2_k, scalar::dot_q2_k, BlockQ8K, blocks::q2_k::BYTES);
scalar_kernel!(k_q3_k, scalar::dot_q3_k, BlockQ8K, blocks::q3_k::BYTES);
scalar_kernel!(k_q4_k, scalar::dot_q4_k, BlockQ8K, blocks::q4_k::BYTES);
scalar_kernel!(k_q5_k, scalar::dot_q5_k, BlockQ8K, blocks::q5_k::BYTES);
scalar_kernel!(k_q6_k, scalar::dot_q6_k, BlockQ8K, blocks::q6_k::BYTES);
scalar_kernel!(k_f32, scalar::dot_f32, f32, 4);
scalar_kernel!(k_f16, scalar::dot_f16, u16, 2);
scalar_kernel!(k_bf16, scalar::dot_bf16, u16, 2);

fn scalar_plan(t: GgmlType) -> Option<Plan> {
    use GgmlType as G;
    Some(match t {
        G::Q4_0 => Plan::Q8_0(k_q4_0),
        G::Q4_1 => Plan::Q8_1(k_q4_1),
        G::Q5_0 => Plan::Q8_0(k_q5_0),
        G::Q5_1 => Plan::Q8_1(k_q5_1),
        G::Q8_0 => Plan::Q8_0(k_q8_0),
        G::Q2_K => Plan::Q8K(k_q2_k),
        G::Q3_K => Plan::Q8K(k_q3_k),
        G::Q4_K => Plan::Q8K(k_q4_k),
        G::Q5_K => Plan::Q8K(k_q5_k),
        G::Q6_K => Plan::Q8K(k_q6_k),
        G::F32 => Plan::F32(k_f32),
        G::F16 => Plan::F16(k_f16),
        G::BF16 => Plan::BF16(k_bf16),
        _ => return None,
    })
}

/// Quantizes `x` (`[n_rows, k]`) row by row into `k / qk` blocks per row, in parallel when large.
fn quantize_rows<A: Default + Clone + Send>(x: &[f32], k: usize, qk: usize, f: impl Fn(&[f32], &mut [A]) + Sync) -> Vec<A> {
    let per_row = k / qk;
    let n_rows = x.len() / k;
    let mut a = vec![A::default(); per_row * n_rows];
    if n_rows >= 4 && x.len() >= 1 << 16 {
        a.par_chunks_mut(per_row).zip(x.par_chunks(k)).for_each(|(o, xr)| f(xr, o));
    } else {
        a.chunks_mut(per_row).zip(x.chunks(k)).for_each(|(o, xr)| f(xr, o));
    }
    a
}

#[derive(Clone, Copy)]
struct Shape {
    n_out: usize,
    nb: usize,
    row_bytes: usize,
    n_rows: usize,
}

/// A raw pointer to `y` shared by the tasks; each writes a disjoint set of columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (their own column range) and `drive` joins them all
// before `y`'s borrow ends.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Weight rows per rayon task: enough tasks to balance the pool (≈ 8 per thread), each with at
/// least ~16 KiB of weights so the per-task cost stays small against a memory-bound decode.
fn rows_per_task(n_out: usize, row_bytes: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let by_balance = n_out.div_ceil(8 * threads);
    let by_bytes = (16 * 1024usize).div_ceil(row_bytes.max(1));
    by_balance.max(by_bytes).clamp(1, n_out).next_multiple_of(4).min(n_out)
}

fn drive<A: Sync>(kern: Kernel<A>, w: &[u8], a: &[A], a_stride: usize, s: Shape, y: &mut [f32]) {
    debug_assert_eq!(a.len(), a_stride * s.n_rows);
    debug_assert_eq!(w.len(), s.n_out * s.row_bytes);
    let chunk = rows_per_task(s.n_out, s.row_bytes);
    let n_tasks = s.n_out.div_ceil(chunk);
    let yp = OutPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let yp = yp;
        let o0 = t * chunk;
        let o1 = (o0 + chunk).min(s.n_out);
        let mut out = [0.0f32; MAX_ROWS];
        for r0 in (0..s.n_rows).step_by(MAX_ROWS) {
            let nr = MAX_ROWS.min(s.n_rows - r0);
            let ar = &a[r0 * a_stride..];
            for o in o0..o1 {
                // SAFETY: `w` holds n_out whole rows (checked by `matmul_at`), `ar` holds `nr` rows
                // of `a_stride` (= nb) activations, `out` has MAX_ROWS ≥ nr slots, and `plan` only
                // hands out kernels of levels the CPU supports.
                unsafe { kern(w.as_ptr().add(o * s.row_bytes), ar.as_ptr(), a_stride, s.nb, nr, out.as_mut_ptr()) };
                for (i, v) in out[..nr].iter().enumerate() {
                    // SAFETY: (r0 + i) < n_rows and o < n_out, so the index is inside `y`; column o
                    // belongs to this task only.
                    unsafe { *yp.0.add((r0 + i) * s.n_out + o) = *v };
                }
            }
        }
    };
    if n_tasks == 1 {
        task(0);
    } else {
        (0..n_tasks).into_par_iter().for_each(task);
    }
}

#[cfg(test)]
mod tests;
