//! Portable scalar dot products of one weight row (GGUF blocks) with one activation row, one per
//! format: the fallback on CPUs without AVX2 and the oracle the SIMD kernels are tested against.
//!
//! They follow ggml's `ggml_vec_dot_*_generic` (ggml-cpu `quants.c`): exact integer sums per block
//! or sub-block, scaled by `d_w·d_x` (minus `dmin·d_x·Σ m·bsum` for formats with mins) and summed
//! in f32; the float formats accumulate f32 products in f64 (`ggml_float`), as ggml's scalar
//! `ggml_vec_dot_f32/f16/bf16` do.

#![allow(clippy::needless_range_loop)] // indexed loops mirror ggml's reference code

use super::act::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use super::blocks::{self, bf16_bits_to_f32, f16_at, f16_bits_to_f32, k4_scales_mins, q3k_scales};

#[inline(always)]
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Q4_0 weights · Q8_0 activations.
pub fn dot_q4_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    use blocks::q4_0::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let qs = &b[QS..QS + 16];
        let mut s = 0i32;
        for j in 0..16 {
            s += ((qs[j] & 0xF) as i32 - 8) * y.qs[j] as i32;
            s += ((qs[j] >> 4) as i32 - 8) * y.qs[j + 16] as i32;
        }
        sumf += (f16_at(b, D) * y.d) * s as f32;
    }
    sumf
}

/// Q4_1 weights · Q8_1 activations.
pub fn dot_q4_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    use blocks::q4_1::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let qs = &b[QS..QS + 16];
        let mut s = 0i32;
        for j in 0..16 {
            s += (qs[j] & 0xF) as i32 * y.qs[j] as i32;
            s += (qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
        }
        sumf += (f16_at(b, D) * y.d) * s as f32 + f16_at(b, M) * y.s;
    }
    sumf
}

/// Q5_0 weights · Q8_0 activations.
pub fn dot_q5_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    use blocks::q5_0::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let qh = u32_at(b, QH);
        let qs = &b[QS..QS + 16];
        let mut s = 0i32;
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            s += (((qs[j] & 0xF) as u32 | h0) as i32 - 16) * y.qs[j] as i32;
            s += (((qs[j] >> 4) as u32 | h1) as i32 - 16) * y.qs[j + 16] as i32;
        }
        sumf += (f16_at(b, D) * y.d) * s as f32;
    }
    sumf
}

/// Q5_1 weights · Q8_1 activations.
pub fn dot_q5_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    use blocks::q5_1::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let qh = u32_at(b, QH);
        let qs = &b[QS..QS + 16];
        let mut s = 0i32;
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            s += ((qs[j] & 0xF) as u32 | h0) as i32 * y.qs[j] as i32;
            s += ((qs[j] >> 4) as u32 | h1) as i32 * y.qs[j + 16] as i32;
        }
        sumf += (f16_at(b, D) * y.d) * s as f32 + f16_at(b, M) * y.s;
    }
    sumf
}

/// Q8_0 weights · Q8_0 activations.
pub fn dot_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    use blocks::q8_0::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let mut s = 0i32;
        for j in 0..32 {
            s += (b[QS + j] as i8) as i32 * y.qs[j] as i32;
        }
        sumf += (f16_at(b, D) * y.d) * s as f32;
    }
    sumf
}

/// Q2_K weights · Q8_K activations.
pub fn dot_q2_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    use blocks::q2_k::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let sc = &b[SCALES..SCALES + 16];
        let qs = &b[QS..QS + 64];
        let mut summs = 0i32;
        for i in 0..16 {
            summs += (sc[i] >> 4) as i32 * y.bsums[i] as i32;
        }
        let mut isum = 0i32;
        for i in 0..16 {
            // Sub-block i = elements 16i..16i+16: half n, 2-bit plane j, byte offset l0.
            let (n, j, l0) = (i / 8, (i % 8) / 2, 16 * (i % 2));
            let mut s = 0i32;
            for l in 0..16 {
                let q = (qs[32 * n + l0 + l] >> (2 * j)) & 3;
                s += q as i32 * y.qs[16 * i + l] as i32;
            }
            isum += (sc[i] & 0xF) as i32 * s;
        }
        let d = y.d * f16_at(b, D);
        let dmin = y.d * f16_at(b, DMIN);
        sumf += d * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Q3_K weights · Q8_K activations.
pub fn dot_q3_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    use blocks::q3_k::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let hm = &b[HMASK..HMASK + 32];
        let qs = &b[QS..QS + 64];
        let sc = q3k_scales(&b[SCALES..SCALES + 12]);
        let mut isum = 0i32;
        for i in 0..16 {
            let (n, j, l0) = (i / 8, (i % 8) / 2, 16 * (i % 2));
            let m = 1u8 << (4 * n + j);
            let mut s = 0i32;
            for l in 0..16 {
                let lo = ((qs[32 * n + l0 + l] >> (2 * j)) & 3) as i32;
                let q = lo - if hm[l0 + l] & m != 0 { 0 } else { 4 };
                s += q * y.qs[16 * i + l] as i32;
            }
            isum += sc[i] as i32 * s;
        }
        sumf += (y.d * f16_at(b, D)) * isum as f32;
    }
    sumf
}

/// Q4_K weights · Q8_K activations.
pub fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    use blocks::q4_k::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let (sc, mn) = k4_scales_mins(&b[SCALES..SCALES + 12]);
        let qs = &b[QS..QS + 128];
        let mut isum = 0i32;
        let mut msum = 0i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                lo += (q & 0xF) as i32 * y.qs[64 * j + l] as i32;
                hi += (q >> 4) as i32 * y.qs[64 * j + 32 + l] as i32;
            }
            isum += sc[2 * j] as i32 * lo + sc[2 * j + 1] as i32 * hi;
        }
        for s in 0..8 {
            msum += mn[s] as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32);
        }
        let d = y.d * f16_at(b, D);
        let dmin = y.d * f16_at(b, DMIN);
        sumf += d * isum as f32 - dmin * msum as f32;
    }
    sumf
}

/// Q5_K weights · Q8_K activations.
pub fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    use blocks::q5_k::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let (sc, mn) = k4_scales_mins(&b[SCALES..SCALES + 12]);
        let qh = &b[QH..QH + 32];
        let qs = &b[QS..QS + 128];
        let mut isum = 0i32;
        let mut msum = 0i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                let h = qh[l] >> (2 * j);
                let ql = (q & 0xF) as i32 | (((h & 1) as i32) << 4);
                let qhh = (q >> 4) as i32 | ((((h >> 1) & 1) as i32) << 4);
                lo += ql * y.qs[64 * j + l] as i32;
                hi += qhh * y.qs[64 * j + 32 + l] as i32;
            }
            isum += sc[2 * j] as i32 * lo + sc[2 * j + 1] as i32 * hi;
        }
        for s in 0..8 {
            msum += mn[s] as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32);
        }
        let d = y.d * f16_at(b, D);
        let dmin = y.d * f16_at(b, DMIN);
        sumf += d * isum as f32 - dmin * msum as f32;
    }
    sumf
}

/// Q6_K weights · Q8_K activations.
pub fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    use blocks::q6_k::*;
    let mut sumf = 0.0f32;
    for (b, y) in w.chunks_exact(BYTES).zip(a) {
        let ql = &b[QL..QL + 128];
        let qh = &b[QH..QH + 64];
        let sc = &b[SCALES..SCALES + 16];
        let mut isum = 0i32;
        for i in 0..16 {
            // Sub-block i = elements 16i..16i+16: half n, quarter t, byte offset l0 (ggml layout).
            let (n, t, l0) = (i / 8, (i % 8) / 2, 16 * (i % 2));
            let mut s = 0i32;
            for l in 0..16 {
                let li = l0 + l;
                let lowb = ql[64 * n + li + if t % 2 == 1 { 32 } else { 0 }];
                let low = if t >= 2 { lowb >> 4 } else { lowb & 0xF };
                let high = (qh[32 * n + li] >> (2 * t)) & 3;
                let q = (low | (high << 4)) as i32 - 32;
                s += q * y.qs[16 * i + l] as i32;
            }
            isum += (sc[i] as i8) as i32 * s;
        }
        sumf += (y.d * f16_at(b, D)) * isum as f32;
    }
    sumf
}

/// F32 weights (little-endian bytes) · f32 activations.
pub fn dot_f32(w: &[u8], a: &[f32]) -> f32 {
    let mut sum = 0.0f64;
    for (b, &x) in w.chunks_exact(4).zip(a) {
        sum += (f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * x) as f64;
    }
    sum as f32
}

/// F16 weights · activations already rounded to f16.
pub fn dot_f16(w: &[u8], a: &[f32]) -> f32 {
    let mut sum = 0.0f64;
    for (b, &x) in w.chunks_exact(2).zip(a) {
        sum += (f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])) * x) as f64;
    }
    sum as f32
}

/// BF16 weights · activations already rounded to bf16.
pub fn dot_bf16(w: &[u8], a: &[f32]) -> f32 {
    let mut sum = 0.0f64;
    for (b, &x) in w.chunks_exact(2).zip(a) {
        sum += (bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])) * x) as f64;
    }
    sum as f32
}

/// `Σ w[i]·x[i]` as llama.cpp's AVX-512 build computes `ggml_vec_dot_f32` (ggml-cpu `vec.cpp`,
/// `GGML_F32_STEP` 64, `GGML_F32_EPR` 16): four 16-lane accumulators, each lane a fused
/// multiply-add chain over its elements (`i ≡ lane (mod 16)` of block `j` of every 64), reduced
/// `a0 + a2`, `a1 + a3`, then those two, then the 16 lanes as GCC's `_mm512_reduce_add_ps`; the
/// elements past the last whole 64 added one by one in f32 (`sumf += x·y`). `f32::mul_add` is
/// the hardware FMA's rounding, so every SIMD level gives these bits.
pub fn dot_f32_ggml(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let np = n / 64 * 64;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *v = w[e].mul_add(x[e], *v);
            }
        }
    }
    let s02: [f32; 16] = std::array::from_fn(|l| acc[0][l] + acc[2][l]);
    let s13: [f32; 16] = std::array::from_fn(|l| acc[1][l] + acc[3][l]);
    let s: [f32; 16] = std::array::from_fn(|l| s02[l] + s13[l]);
    let mut sumf = crate::backend::cpu::vecops::reduce16(&s);
    for e in np..n {
        sumf += w[e] * x[e];
    }
    sumf
}
