//! Quantized matrix multiplication on CPU: `y = x · Wᵀ` with `W` kept in its GGUF blocks (never
//! widened to f32), activations quantized to the format's ggml `vec_dot_type` exactly as llama.cpp
//! does, SIMD chosen at run time (AVX-512 VNNI, AVX2, scalar), threads from the caller's rayon pool.
//!
//! Sources: ggml `ggml-common.h` (block layouts), ggml-cpu `quants.c` / `arch/x86/quants.c`
//! (activation quantizers and the integer structure of `ggml_vec_dot_*`), ggml-cpu `vec.cpp`
//! (f32/f16/bf16 dot products).
//!
//! Layout of the work: the output columns (`n_out`, weight rows) are split into chunks run as rayon
//! tasks (and, for a prefill with few weight rows, the activation rows too); inside a
//! task the activation rows are walked in groups of up to [`MAX_ROWS`] and each weight block is
//! unpacked once per group and dotted with every row of the group, so a prefill (`n_rows` large)
//! loads each weight block once per 8 tokens, while a decode (`n_rows` = 1..8) is one sequential
//! pass over the weights, one weight row at a time (interleaving several rows' streams measured
//! markedly slower from DRAM). Q4_0/Q5_0/Q8_0 take each row's activations grouped by 8 blocks
//! (the GEMV sums 8 blocks per vector) and, for full groups of 8 rows, interleaved
//! ([`BlockQ8_0x8`]); the float formats block over 4 weight rows × 4 activation rows. On the
//! AVX-512 and AVX2 levels a Q4_K matmul of ≥ 8 rows (Q6_K: ≥ 16) goes to the register-tiled
//! kernels instead (`tiled`: weights repacked per call into 16-row panels, one output column per
//! vector lane, 16 × 4 (AVX2 Q4_K: 16 × 4, Q6_K: 16 × 2) outputs per inner loop; same results;
//! `FAK_CPU_TILED=0` turns them off).
//!
//! Batch invariance: on every level, a row's result depends only on that row (never on `n_rows`
//! or on which rows share a kernel call) for all target formats (Q4_1/Q5_1, in no target model,
//! are not on the SIMD levels) — and, through [`matmul_rows`], on the row's [`LlamaRow`], which
//! the CPU backend derives from the token's position and its sequence's prompt length only — so
//! the engine gives a sequence the same logits alone or batched, decoded or recomputed by a prefill.
//!
//! Parity: on x86 (AVX2 / AVX-512 levels) the f32 accumulation of each kernel is the one of the
//! kernel llama.cpp's x86 CPU build runs for the format (`ggml_vec_dot_*`, llamafile tinyBLAS,
//! the repacked Q4_K GEMM/GEMV, the tiled Q6_K kernel), so results are bit-identical to it.
//!
//! `FAK_CPU_SIMD=scalar|avx2|avx512` lowers the SIMD level (tests, benches); [`simd_level`] names
//! the one in use. Every level gives the same integer sums; only f32 summation order differs.

mod act;
mod blocks;
mod scalar;
mod simd;

#[cfg(target_arch = "x86_64")]
mod tiled;
#[cfg(target_arch = "x86_64")]
mod tiled_avx2;
#[cfg(target_arch = "x86_64")]
mod tiled_q4k;
#[cfg(target_arch = "x86_64")]
mod tiled_q6k;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use act::{BlockQ8K, BlockQ8_0, BlockQ8_0x8, BlockQ8_1, LlamaRow};
pub use scalar::dot_f32_ggml;
pub use simd::{active_level, available_levels, detected_level, SimdLevel};

use crate::quant::GgmlType;
use crate::{FakError, Result};
use rayon::prelude::*;

/// Activation rows a kernel call handles at once (the prefill micro-tile height).
pub const MAX_ROWS: usize = 8;
/// Weight rows a kernel call handles at once (the float kernels block over them; the quantized
/// kernels walk them one by one).
pub const MAX_W: usize = 4;

/// Computes `out[j·MAX_ROWS + r] = W_row(j) · a_row(r)` for `j < nw` (≤ [`MAX_W`]) and `r < nr`
/// (≤ [`MAX_ROWS`]), where weight row `j` starts at `w + j·w_stride` and holds `nb` blocks
/// (elements for the float formats) and activation row `r` starts at `a + r·a_stride` (in `A`s).
///
/// # Safety
/// `w` must point to `nw` whole weight rows, each activation row to `nb` valid `A`s, `out` to
/// `MAX_W·MAX_ROWS` floats, and the CPU must support the instructions of the kernel's level.
pub(crate) type Kernel<A> =
    unsafe fn(w: *const u8, w_stride: usize, nw: usize, a: *const A, a_stride: usize, nb: usize, nr: usize, out: *mut f32);

/// A prefill kernel over one interleaved group of 8 activation rows ([`BlockQ8_0x8`]):
/// `out[j·MAX_ROWS + r] = W_row(j) · a_row(r)` for `j < nw`, `r < 8`.
///
/// # Safety
/// As [`Kernel`], with `a` pointing to the group's `nb` interleaved blocks.
pub(crate) type KernelX8 = unsafe fn(w: *const u8, w_stride: usize, nw: usize, a: *const BlockQ8_0x8, nb: usize, out: *mut f32);

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

/// [`matmul`] where `rows[r]` names the kernel llama.cpp's CPU backend runs for row `r`
/// ([`LlamaRow`]): for Q4_K weights (which its x86 build repacks) the 4-row GEMM and the GEMV
/// accumulate in f32 differently, and for Q6_K the tiled K-quant kernel (ubatches of ≥ 8 rows)
/// differs from `ggml_vec_dot_q6_K_q8_K`; fak follows the one named so that its results are
/// bit-identical. Other formats ignore `rows` (llama.cpp's kernels for them do not depend on the
/// row count). A row's result still depends only on the row and its `LlamaRow`.
///
/// Errors: as [`matmul`]; [`FakError::InvalidArgument`] when `rows` is not `n_rows` long.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize, y: &mut [f32], rows: &[LlamaRow]) -> Result<()> {
    if rows.len() != n_rows {
        return Err(FakError::invalid("rows", format!("{} row kinds for {n_rows} rows", rows.len())));
    }
    matmul_impl(simd::active_level(), wtype, w, n_out, k, x, n_rows, y, Some(rows), tiled_on())
}

/// [`matmul`] on an explicit SIMD level (for tests and benches); a level above what this CPU
/// supports is an [`FakError::InvalidArgument`].
#[allow(clippy::too_many_arguments)]
pub fn matmul_at(level: SimdLevel, wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize, y: &mut [f32]) -> Result<()> {
    matmul_impl(level, wtype, w, n_out, k, x, n_rows, y, None, tiled_on())
}

/// `FAK_CPU_TILED=0` turns off the register-tiled Q4_K/Q6_K prefill kernels (`tiled`, same
/// results) for benches that measure the one-row kernels they replace.
fn tiled_on() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("FAK_CPU_TILED").map_or(true, |v| v != "0"))
}

#[allow(clippy::too_many_arguments)]
fn matmul_impl(level: SimdLevel, wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize, y: &mut [f32], rows: Option<&[LlamaRow]>, tiled: bool) -> Result<()> {
    if level > simd::detected_level() {
        return Err(FakError::invalid("level", format!("{} is not supported by this CPU", level.name())));
    }
    let (bs, ts) = wtype.block_geometry();
    let plan = plan(wtype, level)
        .ok_or_else(|| FakError::Unsupported(format!("matmul with {} weights", wtype.name())))?;
    if !k.is_multiple_of(bs) {
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
    let q = Quantizers::at(level);
    match plan {
        Plan::Q8_0(kern) => drive(kern, None, w, &quantize_rows(x, k, QK8_BLOCK, q.q8_0), nb, shape, y),
        Plan::Q8_0x8(kern, kx8) => {
            let a = quantize_rows(x, k, QK8_BLOCK, q.q8_0);
            let grouped = act::group_q8_0(&a, nb);
            if n_rows >= MAX_ROWS {
                let off = match wtype {
                    GgmlType::Q4_0 => 8,
                    GgmlType::Q5_0 => 16,
                    _ => 128,
                };
                let ax8 = act::interleave_q8_0(&a, nb, off);
                drive(kern, Some((kx8, &ax8[..])), w, &grouped, nb.div_ceil(8), shape, y)
            } else {
                drive(kern, None, w, &grouped, nb.div_ceil(8), shape, y)
            }
        }
        Plan::Q8_1(kern) => drive(kern, None, w, &quantize_rows(x, k, QK8_BLOCK, q.q8_1), nb, shape, y),
        Plan::Q8K(kern) => {
            let mut a = quantize_rows(x, k, act::QK_K, q.q8_k);
            if let Some(rows) = rows.filter(|_| matches!(wtype, GgmlType::Q4_K | GgmlType::Q6_K)) {
                for (blocks, &kind) in a.chunks_mut(nb).zip(rows) {
                    blocks.iter_mut().for_each(|b| b.row = kind);
                }
            }
            match q4k_unrepacked(level, wtype, n_out) {
                Some(kern) => drive(kern, None, w, &a, nb, shape, y),
                None => q8k_drive(level, wtype, kern, w, &a, shape, y, tiled),
            }
        }
        // llamafile's tinyBLAS declines shapes it cannot tile (AVX-512: K not a multiple of 16,
        // fewer than 4 or a ragged number of weight rows): ggml_vec_dot_f32 computes those.
        Plan::F32(kern) if !k.is_multiple_of(16) || !n_out.is_multiple_of(4) => {
            let alone = vec![LlamaRow { single: true, ..Default::default() }; n_rows];
            f32_split(kern, w, n_out, k, x, n_rows, y, &alone)
        }
        Plan::F32(kern) => match rows.filter(|r| r.iter().any(|r| r.single)) {
            None => drive(kern, None, w, x, k, shape, y),
            Some(rows) => f32_split(kern, w, n_out, k, x, n_rows, y, rows),
        },
        Plan::F16(kern) => drive(kern, None, w, &quantize_rows(x, k, 1, q.f16), k, shape, y),
        Plan::BF16(kern) => drive(kern, None, w, &quantize_rows(x, k, 1, q.bf16), k, shape, y),
    }
    Ok(())
}

/// The k-quant matmul on Q8_K activations `a` (`shape.n_rows` rows of `shape.nb` blocks, each
/// row's [`LlamaRow`] in its blocks): the register-tiled kernels where `tiled` and the level and
/// row count take them, else `kern` through [`drive`].
#[allow(clippy::too_many_arguments)]
fn q8k_drive(level: SimdLevel, wtype: GgmlType, kern: Kernel<BlockQ8K>, w: &[u8], a: &[BlockQ8K], shape: Shape, y: &mut [f32], tiled: bool) {
    let Shape { n_out, nb, n_rows, .. } = shape;
    #[cfg(target_arch = "x86_64")]
    if tiled && level >= SimdLevel::Avx2 {
        use tiled::{any_tiled, matmul as tiled_mm, MIN_ROWS_Q4K, MIN_ROWS_Q6K};
        let avx512 = level == SimdLevel::Avx512;
        // SAFETY (all four): the level (checked against the CPU by the callers) includes the
        // kernel's instructions (Avx512: AVX-512 F/BW/VL/VNNI; Avx2: AVX2 + FMA + F16C), `kern`
        // is that level's; the callers checked the lengths.
        match wtype {
            GgmlType::Q4_K if n_rows < MIN_ROWS_Q4K => {}
            GgmlType::Q6_K if n_rows < MIN_ROWS_Q6K => {}
            GgmlType::Q4_K if avx512 => return unsafe { tiled_mm::<tiled_q4k::Q4K>(w, n_out, nb, a, n_rows, y, kern) },
            GgmlType::Q4_K => return unsafe { tiled_mm::<tiled_avx2::Q4KAvx2>(w, n_out, nb, a, n_rows, y, kern) },
            GgmlType::Q6_K if avx512 && any_tiled::<tiled_q6k::Q6K>(a, nb) => {
                return unsafe { tiled_mm::<tiled_q6k::Q6K>(w, n_out, nb, a, n_rows, y, kern) };
            }
            GgmlType::Q6_K if !avx512 && any_tiled::<tiled_avx2::Q6KAvx2>(a, nb) => {
                return unsafe { tiled_mm::<tiled_avx2::Q6KAvx2>(w, n_out, nb, a, n_rows, y, kern) };
            }
            _ => {}
        }
    }
    let _ = (level, wtype, tiled);
    drive(kern, None, w, a, nb, shape, y)
}

/// Q8_K activations of `x` (`[n_rows, k]`, `k` a multiple of 256) exactly as [`matmul`] quantizes
/// them for a k-quant weight type (`n_rows · k / 256` blocks, row after row; `row` fields
/// default), for [`matmul_q8k`]: a row that several matmuls read (a token's row in a MoE layer,
/// read by each of its experts) is quantized once.
///
/// Errors: [`FakError::InvalidArgument`] when `k` is not a multiple of 256 or `x.len()` of `k`.
pub fn quantize_q8k(x: &[f32], k: usize) -> Result<Vec<BlockQ8K>> {
    if k == 0 || !k.is_multiple_of(act::QK_K) || !x.len().is_multiple_of(k) {
        return Err(FakError::invalid("k", format!("{k} is not a multiple of 256 dividing {} inputs", x.len())));
    }
    Ok(quantize_rows(x, k, act::QK_K, Quantizers::at(simd::active_level()).q8_k))
}

/// [`matmul_rows`] on activations already quantized by [`quantize_q8k`]: `a` holds `n_rows` rows
/// of `k / 256` Q8_K blocks, each row's [`LlamaRow`] in its blocks' `row` field; k-quant weights
/// (Q2_K … Q6_K) only. Same results as [`matmul_rows`] on the rows the blocks came from.
///
/// Errors: [`FakError::Unsupported`] for a weight type whose activations are not Q8_K;
/// [`FakError::InvalidArgument`] for lengths that do not match the shape.
#[allow(clippy::too_many_arguments)]
pub fn matmul_q8k(wtype: GgmlType, w: &[u8], n_out: usize, k: usize, a: &[BlockQ8K], n_rows: usize, y: &mut [f32]) -> Result<()> {
    let level = simd::active_level();
    let Some(Plan::Q8K(kern)) = plan(wtype, level) else {
        return Err(FakError::Unsupported(format!("Q8_K activations for {} weights", wtype.name())));
    };
    let nb = k / act::QK_K;
    let row_bytes = nb * wtype.block_geometry().1;
    if !k.is_multiple_of(act::QK_K) || w.len() != n_out * row_bytes || a.len() != n_rows * nb || y.len() != n_rows * n_out {
        return Err(FakError::invalid("a", format!("{} blocks, {} weight bytes, {} outputs for [{n_rows}, {k}] × {n_out} rows of {}", a.len(), w.len(), y.len(), wtype.name())));
    }
    if n_rows == 0 || n_out == 0 {
        return Ok(());
    }
    let shape = Shape { n_out, nb, row_bytes, n_rows };
    match q4k_unrepacked(level, wtype, n_out) {
        Some(kern) => drive(kern, None, w, a, nb, shape, y),
        None => q8k_drive(level, wtype, kern, w, a, shape, y, tiled_on()),
    }
    Ok(())
}

/// llama.cpp's x86 build repacks a Q4_K matrix (and runs its repacked GEMM/GEMV, whose arithmetic
/// `k_q4_k` follows) only when its rows are a multiple of 8 (ggml-cpu `repack.cpp`,
/// `ggml_repack_get_optimal_repack_type`); any other Q4_K matrix takes `ggml_vec_dot_q4_K_q8_K`,
/// whose f32 order this kernel follows (a tiny Gated DeltaNet's 4-row `ssm_alpha`/`ssm_beta`).
fn q4k_unrepacked(level: SimdLevel, wtype: GgmlType, n_out: usize) -> Option<Kernel<BlockQ8K>> {
    #[cfg(target_arch = "x86_64")]
    if wtype == GgmlType::Q4_K && !n_out.is_multiple_of(8) && level >= SimdLevel::Avx2 {
        return Some(x86::q4k_unrepacked(level == SimdLevel::Avx512));
    }
    let _ = (level, wtype, n_out);
    None
}

/// F32 weights where some rows are computed alone ([`LlamaRow::single`]): those rows take
/// [`scalar::dot_f32_ggml`] (llama.cpp's `ggml_vec_dot_f32`), the others the tinyBLAS kernel.
#[allow(clippy::too_many_arguments)]
fn f32_split(kern: Kernel<f32>, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize, y: &mut [f32], rows: &[LlamaRow]) {
    let (alone, rest): (Vec<usize>, Vec<usize>) = (0..n_rows).partition(|&r| rows[r].single);
    if !rest.is_empty() {
        let xs: Vec<f32> = rest.iter().flat_map(|&r| x[r * k..(r + 1) * k].iter().copied()).collect();
        let mut ys = vec![0f32; rest.len() * n_out];
        let shape = Shape { n_out, nb: k, row_bytes: 4 * k, n_rows: rest.len() };
        drive(kern, None, w, &xs, k, shape, &mut ys);
        for (i, &r) in rest.iter().enumerate() {
            y[r * n_out..(r + 1) * n_out].copy_from_slice(&ys[i * n_out..(i + 1) * n_out]);
        }
    }
    let wf: &[f32] = bytemuck_f32(w);
    for &r in &alone {
        let xr = &x[r * k..(r + 1) * k];
        let yr = &mut y[r * n_out..(r + 1) * n_out];
        if n_out >= 64 {
            yr.par_iter_mut().enumerate().for_each(|(o, v)| *v = scalar::dot_f32_ggml(&wf[o * k..(o + 1) * k], xr));
        } else {
            yr.iter_mut().enumerate().for_each(|(o, v)| *v = scalar::dot_f32_ggml(&wf[o * k..(o + 1) * k], xr));
        }
    }
}

/// The f32 values of F32 weight blocks (little-endian, 4-byte aligned: the GGUF data section is
/// 32-byte aligned and every F32 row is whole floats).
fn bytemuck_f32(w: &[u8]) -> &[f32] {
    assert!(w.as_ptr().align_offset(4) == 0 && w.len() % 4 == 0, "F32 weights must be 4-byte aligned");
    // SAFETY: aligned and sized as checked above; any bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts(w.as_ptr() as *const f32, w.len() / 4) }
}

/// Quantizes the activations `x` (`[n_rows, k]`) to a format's ggml `vec_dot_type` and returns the
/// blocks in ggml's byte layout, row after row (for tests: `"Q8_0"`, `"Q8_1"`, `"Q8_K"`).
pub fn quantize_activations(vec_dot_type: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    match vec_dot_type {
        GgmlType::Q8_0 | GgmlType::Q8_1 if !x.len().is_multiple_of(QK8_BLOCK) => {
            Err(FakError::invalid("x", format!("length {} is not a multiple of 32", x.len())))
        }
        GgmlType::Q8_K if !x.len().is_multiple_of(act::QK_K) => {
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

/// Row quantizers of one SIMD level (all levels give bit-identical results).
struct Quantizers {
    q8_0: fn(&[f32], &mut [BlockQ8_0]),
    q8_1: fn(&[f32], &mut [BlockQ8_1]),
    q8_k: fn(&[f32], &mut [BlockQ8K]),
    f16: fn(&[f32], &mut [f32]),
    bf16: fn(&[f32], &mut [f32]),
}

impl Quantizers {
    fn at(level: SimdLevel) -> Quantizers {
        #[cfg(target_arch = "x86_64")]
        if level >= SimdLevel::Avx2 {
            // SAFETY (each wrapper): `matmul_at` only accepts levels the CPU supports, and every
            // level from Avx2 up includes AVX2 + F16C.
            return Quantizers {
                q8_0: |x, o| unsafe { x86::quant::row_q8_0(x, o) },
                q8_1: |x, o| unsafe { x86::quant::row_q8_1(x, o) },
                q8_k: |x, o| unsafe { x86::quant::row_q8_k(x, o) },
                f16: |x, o| unsafe { x86::quant::row_f16(x, o) },
                bf16: |x, o| unsafe { x86::quant::row_bf16(x, o) },
            };
        }
        let _ = level;
        Quantizers {
            q8_0: act::quantize_row_q8_0,
            q8_1: act::quantize_row_q8_1,
            q8_k: act::quantize_row_q8_k,
            f16: |x, o| o.iter_mut().zip(x).for_each(|(o, &v)| *o = blocks::f16_bits_to_f32(blocks::f32_to_f16_bits(v))),
            bf16: |x, o| o.iter_mut().zip(x).for_each(|(o, &v)| *o = blocks::bf16_bits_to_f32(blocks::f32_to_bf16_bits(v))),
        }
    }
}

/// The kernel for a weight type at a level, tagged with its activation type.
enum Plan {
    /// Q8_0 activations, row-major blocks (the scalar kernels).
    Q8_0(Kernel<BlockQ8_0>),
    /// Q8_0 activations for the SIMD kernels: each row's blocks grouped by 8
    /// ([`act::group_q8_0`]), and a kernel for interleaved groups of 8 rows ([`act::interleave_q8_0`]).
    Q8_0x8(Kernel<BlockQ8_0x8>, KernelX8),
    Q8_1(Kernel<BlockQ8_1>),
    Q8K(Kernel<BlockQ8K>),
    F32(Kernel<f32>),
    /// F16 weights; activations rounded to f16 (ggml's `vec_dot_type`), held as f32.
    F16(Kernel<f32>),
    /// BF16 weights; activations rounded to bf16, held as f32.
    BF16(Kernel<f32>),
}

fn plan(t: GgmlType, level: SimdLevel) -> Option<Plan> {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx2 {
            if let Some(p) = x86::plan(t, level == SimdLevel::Avx512) {
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
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const $a, a_stride: usize, nb: usize, nr: usize, out: *mut f32) {
            // SAFETY: the caller guarantees `nw` whole weight rows and `nr` activation rows of `nb`.
            unsafe {
                for j in 0..nw {
                    let ws = std::slice::from_raw_parts(w.add(j * w_stride), nb * $wbytes);
                    for r in 0..nr {
                        let ar = std::slice::from_raw_parts(a.add(r * a_stride), nb);
                        *out.add(j * MAX_ROWS + r) = $dot(ws, ar);
                    }
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
scalar_kernel!(k_f16, scalar::dot_f16, f32, 2);
scalar_kernel!(k_bf16, scalar::dot_bf16, f32, 2);

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
fn quantize_rows<A: Default + Clone + Send>(x: &[f32], k: usize, qk: usize, f: fn(&[f32], &mut [A])) -> Vec<A> {
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
// SAFETY: tasks write disjoint elements (their own tile of y) and `drive` joins them all
// before `y`'s borrow ends.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// How the work is cut into rayon tasks: `out_chunk` weight rows × `row_block` activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tiling {
    out_chunk: usize,
    row_block: usize,
}

/// Enough tasks to balance the pool (≈ 8 per thread); for a decode (`n_rows` ≤ [`MAX_ROWS`]) each
/// task also gets ≥ ~16 KiB of weights so its fixed cost stays small against a memory-bound pass.
/// When the weight rows alone cannot make enough tasks (a small `n_out` in a prefill), the
/// activation rows are split too.
fn tiling(n_out: usize, row_bytes: usize, n_rows: usize, threads: usize) -> Tiling {
    let threads = threads.max(1);
    let want = 8 * threads;
    let by_balance = n_out.div_ceil(want);
    let min_rows = if n_rows <= MAX_ROWS { (16 * 1024usize).div_ceil(row_bytes.max(1)) } else { 4 };
    let out_chunk = by_balance.max(min_rows).next_multiple_of(4).min(n_out).max(1);
    let out_tasks = n_out.div_ceil(out_chunk);
    let mut row_block = n_rows.max(1);
    if out_tasks < 2 * threads && n_rows > 2 * MAX_ROWS {
        let splits = (2 * threads).div_ceil(out_tasks);
        row_block = n_rows.div_ceil(splits).next_multiple_of(MAX_ROWS);
    }
    Tiling { out_chunk, row_block }
}

/// Runs `kern` over all tiles; full, 8-aligned groups of activation rows go to `x8` (kernel and the
/// interleaved activations, `[group][block]`) when given.
fn drive<A: Sync>(kern: Kernel<A>, x8: Option<(KernelX8, &[BlockQ8_0x8])>, w: &[u8], a: &[A], a_stride: usize, s: Shape, y: &mut [f32]) {
    debug_assert_eq!(a.len(), a_stride * s.n_rows);
    debug_assert_eq!(w.len(), s.n_out * s.row_bytes);
    let t = tiling(s.n_out, s.row_bytes, s.n_rows, rayon::current_num_threads());
    let out_tasks = s.n_out.div_ceil(t.out_chunk);
    let row_tasks = s.n_rows.div_ceil(t.row_block);
    let yp = OutPtr(y.as_mut_ptr());
    let task = |id: usize| {
        // Capture the whole `OutPtr` (Send + Sync), not just its raw-pointer field.
        #[allow(clippy::redundant_locals)]
        let yp = yp;
        let (oc, rb) = (id % out_tasks, id / out_tasks);
        let (o0, o1) = (oc * t.out_chunk, ((oc + 1) * t.out_chunk).min(s.n_out));
        let (ra, rz) = (rb * t.row_block, ((rb + 1) * t.row_block).min(s.n_rows));
        let mut out = [0.0f32; MAX_W * MAX_ROWS];
        for r0 in (ra..rz).step_by(MAX_ROWS) {
            let nr = MAX_ROWS.min(rz - r0);
            let ar = &a[r0 * a_stride..];
            for o in (o0..o1).step_by(MAX_W) {
                let nw = MAX_W.min(o1 - o);
                let wp = w.as_ptr().wrapping_add(o * s.row_bytes);
                match x8 {
                    // SAFETY: as below; r0 is a multiple of 8 (row blocks are multiples of
                    // MAX_ROWS = 8), so group r0/8 holds exactly these 8 rows, `nb` blocks each.
                    Some((kx8, ax8)) if nr == 8 => unsafe {
                        kx8(wp, s.row_bytes, nw, ax8[(r0 / 8) * s.nb..].as_ptr(), s.nb, out.as_mut_ptr())
                    },
                    // SAFETY: `w` holds n_out whole rows (checked by `matmul_at`) and
                    // o + nw ≤ n_out, `ar` holds `nr` rows of `a_stride` (= nb) activations,
                    // `out` has MAX_W·MAX_ROWS slots, and `plan` only hands out kernels the CPU
                    // supports.
                    _ => unsafe { kern(wp, s.row_bytes, nw, ar.as_ptr(), a_stride, s.nb, nr, out.as_mut_ptr()) },
                }
                for j in 0..nw {
                    for (i, v) in out[j * MAX_ROWS..j * MAX_ROWS + nr].iter().enumerate() {
                        // SAFETY: (r0 + i) < n_rows and o + j < n_out, so the index is inside
                        // `y`; the element belongs to this task's tile only.
                        unsafe { *yp.0.add((r0 + i) * s.n_out + o + j) = *v };
                    }
                }
            }
        }
    };
    let n_tasks = out_tasks * row_tasks;
    if n_tasks == 1 {
        task(0);
    } else {
        (0..n_tasks).into_par_iter().for_each(task);
    }
}

#[cfg(test)]
mod tests;
