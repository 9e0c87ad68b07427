//! Activation quantizers: f32 rows → the 8-bit blocks a weight format's ggml `vec_dot_type` names
//! (Q8_0, Q8_1, Q8_K), bit-exact with what llama.cpp's x86 CPU build computes:
//!
//! - Q8_0 / Q8_1: ggml-cpu `arch/x86/quants.c` `quantize_row_q8_0` / `quantize_row_q8_1` (the
//!   AVX2 path every x86-64 build with AVX2 runs): `d = amax/127` stored as f16,
//!   `q = round_half_even(x · (127/amax))`, and for Q8_1 `s = f16(d · Σq)` with the f32 `d`.
//!   (`quantize_row_q8_0_ref` differs only in `1/d` vs `127/amax` and `roundf` vs half-even.)
//! - Q8_K: ggml `quantize_row_q8_K_ref` (x86 calls the reference): the element of largest magnitude
//!   `max` sets `iscale = −127/max`, `q = min(127, nearest_int(iscale·x))` with ggml's
//!   `nearest_int` (round half to even), `d = 1/iscale` as f32, and `bsums` = sums of 16 quants.
//!
//! The blocks here are fak's in-memory form (`d` already widened to f32, plus the quant sum the
//! SIMD kernels use); [`to_ggml_bytes`](BlockQ8_0::to_ggml_bytes) gives ggml's byte layout.

use super::blocks::{f16_bits_to_f32, f32_to_f16_bits};

/// Elements per Q8_0/Q8_1 block.
pub const QK8: usize = 32;
/// Elements per Q8_K block.
pub const QK_K: usize = 256;

/// A Q8_0 activation block: `d` is the f16 scale widened to f32, `sum = Σ qs`.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(8))]
pub struct BlockQ8_0 {
    pub d: f32,
    pub sum: i32,
    pub qs: [i8; QK8],
}

/// A Q8_1 activation block: `d` and `s` (= f16(d·Σq)) are the f16 fields widened to f32.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(8))]
pub struct BlockQ8_1 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; QK8],
}

/// 8 Q8_0 activation blocks side by side, their scales and quant sums as vectors, then their
/// quants: either block `i` of 8 consecutive rows ([`interleave_q8_0`], the prefill kernels; like
/// ggml's `block_q8_0x4` repacking of activations) or 8 consecutive blocks of one row
/// ([`group_q8_0`], the GEMV kernels). fak's layout.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub struct BlockQ8_0x8 {
    pub d: [f32; 8],
    pub sum: [i32; 8],
    pub qs: [[i8; QK8]; 8],
    /// Interleaved groups only ([`interleave_q8_0`]): `d8[r]` is `d[r]` in 8 lanes, and
    /// `nls[r][l] = −off · Σ_{4l ≤ e < 4l+4} q[r][e]`, the weight offset's share of lane `l` of
    /// ggml's integer dot (`off` = 8, 16, 128 for Q4_0, Q5_0, Q8_0 offset to unsigned), so that
    /// the AVX-512 prefill kernel gets each lane's exact `Σ (u − off)·q` from one `vpdpbusd`.
    pub d8: [[f32; 8]; 8],
    pub nls: [[i32; 8]; 8],
}

/// Groups each row's `nb` blocks of `a` by 8 consecutive blocks: `[row][nb.div_ceil(8) groups]`,
/// the last group of a row padded with zero blocks (`d = 0`, `Σq = 0`, `q = 0`).
pub fn group_q8_0(a: &[BlockQ8_0], nb: usize) -> Vec<BlockQ8_0x8> {
    let ng = nb.div_ceil(8);
    let rows = a.len().checked_div(nb).unwrap_or(0);
    let mut out = vec![BlockQ8_0x8::default(); rows * ng];
    for (row, og) in a.chunks_exact(nb.max(1)).zip(out.chunks_mut(ng.max(1))) {
        for (i, b) in row.iter().enumerate() {
            let o = &mut og[i / 8];
            o.d[i % 8] = b.d;
            o.sum[i % 8] = b.sum;
            o.qs[i % 8] = b.qs;
        }
    }
    out
}

/// Interleaves each full group of 8 rows of `a` (`nb` blocks per row) into `[group][block]`, with
/// the lane sums of a weight offset `off` (see [`BlockQ8_0x8::nls`]).
pub fn interleave_q8_0(a: &[BlockQ8_0], nb: usize, off: i32) -> Vec<BlockQ8_0x8> {
    let groups = a.len() / nb / 8;
    let mut out = vec![BlockQ8_0x8::default(); groups * nb];
    for (g, og) in out.chunks_mut(nb.max(1)).enumerate().take(groups) {
        for (i, o) in og.iter_mut().enumerate() {
            for r in 0..8 {
                let b = &a[(8 * g + r) * nb + i];
                o.d[r] = b.d;
                o.sum[r] = b.sum;
                o.qs[r] = b.qs;
                o.d8[r] = [b.d; 8];
                for l in 0..8 {
                    o.nls[r][l] = -off * b.qs[4 * l..4 * l + 4].iter().map(|&q| q as i32).sum::<i32>();
                }
            }
        }
    }
    out
}

/// Which of llama.cpp's CPU matmul kernels computes an activation row (see
/// [`matmul_rows`](super::matmul_rows)); fak follows its f32 accumulation order for the weight
/// formats whose kernel depends on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlamaRow {
    /// The row is among the first `n − n mod 4` of its ubatch's `n` rows: llama.cpp's repacked
    /// Q4_K GEMM (`ggml_gemm_q4_K_8x8_q8_K`), else its GEMV.
    pub gemm4: bool,
    /// The row's ubatch has ≥ 8 rows: llama.cpp's tiled K-quant matmul (ggml-cpu `tiled/`,
    /// used for Q6_K), else `ggml_vec_dot_q6_K_q8_K`.
    pub tiled: bool,
    /// The row is computed alone (a one-row ubatch, a pruned output row, a MoE expert's pair):
    /// F32 weights take `ggml_vec_dot_f32` there (llamafile's `sgemm` declines `n < 2`, and
    /// `mul_mat_id` never calls it), else tinyBLAS.
    pub single: bool,
}

/// A Q8_K activation block (ggml `block_q8_K`): f32 `d`, 256 quants, sums of each 16 quants;
/// plus, in the struct's padding, fak's [`LlamaRow`] of the block's row (set by `matmul_rows`).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(8))]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
    pub row: LlamaRow,
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16], row: LlamaRow::default() }
    }
}

/// Largest |x| of a block, as the x86 quantizer's `max_ps` tree computes it (NaNs are skipped).
#[inline(always)]
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m })
}

/// Quantizes one block of 32 to Q8_0 and returns it.
#[inline(always)]
pub fn quantize_block_q8_0(x: &[f32]) -> BlockQ8_0 {
    debug_assert_eq!(x.len(), QK8);
    let amax = amax(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut b = BlockQ8_0 { d: f16_bits_to_f32(f32_to_f16_bits(d)), sum: 0, qs: [0; QK8] };
    let mut sum = 0i32;
    for (q, v) in b.qs.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        let r = r.clamp(-128, 127);
        *q = r as i8;
        sum += r;
    }
    b.sum = sum;
    b
}

/// Quantizes one block of 32 to Q8_1 and returns it.
#[inline(always)]
pub fn quantize_block_q8_1(x: &[f32]) -> BlockQ8_1 {
    debug_assert_eq!(x.len(), QK8);
    let amax = amax(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut b = BlockQ8_1 { d: f16_bits_to_f32(f32_to_f16_bits(d)), s: 0.0, qs: [0; QK8] };
    let mut sum = 0i32;
    for (q, v) in b.qs.iter_mut().zip(x) {
        let r = ((v * id).round_ties_even() as i32).clamp(-128, 127);
        *q = r as i8;
        sum += r;
    }
    b.s = f16_bits_to_f32(f32_to_f16_bits(d * sum as f32));
    b
}

/// Quantizes one super-block of 256 to Q8_K (ggml `quantize_row_q8_K_ref`) and returns it.
#[inline(always)]
pub fn quantize_block_q8_k(x: &[f32]) -> BlockQ8K {
    debug_assert_eq!(x.len(), QK_K);
    let mut b = BlockQ8K::default();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0f32 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        // ggml `nearest_int`: adding 1.5·2^23 rounds half to even; values are within ±127.
        let r = (iscale * v).round_ties_even() as i32;
        *q = r.min(127) as i8;
    }
    for (j, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
    }
    b.d = 1.0 / iscale;
    b
}

/// Quantizes a row of `x.len()` (a multiple of 32) into `out` Q8_0 blocks.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK8)) {
        *b = quantize_block_q8_0(xs);
    }
}

/// Quantizes a row of `x.len()` (a multiple of 32) into `out` Q8_1 blocks.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK8)) {
        *b = quantize_block_q8_1(xs);
    }
}

/// Quantizes a row of `x.len()` (a multiple of 256) into `out` Q8_K blocks.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        *b = quantize_block_q8_k(xs);
    }
}

impl BlockQ8_0 {
    /// ggml `block_q8_0` bytes: f16 d, 32 × i8.
    pub fn to_ggml_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&f32_to_f16_bits(self.d).to_le_bytes());
        out.extend(self.qs.iter().map(|&q| q as u8));
    }
}

impl BlockQ8_1 {
    /// ggml `block_q8_1` bytes: f16 d, f16 s, 32 × i8.
    pub fn to_ggml_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&f32_to_f16_bits(self.d).to_le_bytes());
        out.extend_from_slice(&f32_to_f16_bits(self.s).to_le_bytes());
        out.extend(self.qs.iter().map(|&q| q as u8));
    }
}

impl BlockQ8K {
    /// ggml `block_q8_K` bytes: f32 d, 256 × i8, 16 × i16 bsums.
    pub fn to_ggml_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend(self.qs.iter().map(|&q| q as u8));
        for s in &self.bsums {
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_scale_and_rounding() {
        let mut x = [0.0f32; 32];
        x[0] = 2.54; // amax → q = 127
        x[1] = -1.27; // -1.27 · 127/2.54 = -63.5 → ties to even → -64
        x[2] = 0.01;
        let b = quantize_block_q8_0(&x);
        assert_eq!(b.qs[0], 127);
        assert_eq!(b.qs[1], -64);
        assert_eq!(b.qs[2], 0);
        assert_eq!(b.d, f16_bits_to_f32(f32_to_f16_bits(2.54 / 127.0)));
        assert_eq!(b.sum, 127 - 64);
        let z = quantize_block_q8_0(&[0.0; 32]);
        assert_eq!(z.d, 0.0);
        assert!(z.qs.iter().all(|&q| q == 0));
    }

    #[test]
    fn q8_k_max_maps_to_minus_127() {
        let mut x = [0.0f32; 256];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 100.0) * 0.01;
        }
        let b = quantize_block_q8_k(&x);
        // max |x| is x[255] = 1.55 > 0, so iscale < 0 and that element maps to -127.
        assert_eq!(b.qs[255], -127);
        assert!(b.d < 0.0);
        let s: i32 = b.qs[240..256].iter().map(|&q| q as i32).sum();
        assert_eq!(b.bsums[15] as i32, s);
        for (q, v) in b.qs.iter().zip(x) {
            assert!((*q as f32 * b.d - v).abs() <= b.d.abs() * 0.5 + 1e-6);
        }
    }
}
