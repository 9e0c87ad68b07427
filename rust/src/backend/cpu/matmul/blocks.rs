//! Byte layouts of the GGUF weight blocks the matmul reads (ggml `ggml-common.h`), and the small
//! decoders shared by the scalar and SIMD kernels (f16/bf16 scalars, k-quant 6-bit scales).
//!
//! All multi-byte fields are little-endian; blocks are packed (no padding), so fields are read at
//! byte offsets from the start of the block.

/// Reads an IEEE half at `b[off..off+2]` as f32.
#[inline(always)]
pub fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// f32 → IEEE half bits, round to nearest even (what F16C `vcvtps2ph` with imm 0 and
/// `GGML_CPU_FP32_TO_FP16` do).
#[inline(always)]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// IEEE half bits → f32.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// f32 → bf16 bits exactly as ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, a NaN
/// is kept quiet (`| 64`).
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// bf16 bits → f32 (exact).
#[inline(always)]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Q4_0: `{ d: f16, qs: [u8; 16] }`, element j = low nibble of qs[j], element j+16 = high nibble;
/// value = d·(q − 8).
pub mod q4_0 {
    pub const BYTES: usize = 18;
    pub const D: usize = 0;
    pub const QS: usize = 2;
}

/// Q4_1: `{ d: f16, m: f16, qs: [u8; 16] }`, value = d·q + m.
pub mod q4_1 {
    pub const BYTES: usize = 20;
    pub const D: usize = 0;
    pub const M: usize = 2;
    pub const QS: usize = 4;
}

/// Q5_0: `{ d: f16, qh: u32, qs: [u8; 16] }`, 5th bit of element j is bit j of qh;
/// value = d·(q − 16).
pub mod q5_0 {
    pub const BYTES: usize = 22;
    pub const D: usize = 0;
    pub const QH: usize = 2;
    pub const QS: usize = 6;
}

/// Q5_1: `{ d: f16, m: f16, qh: u32, qs: [u8; 16] }`, value = d·q + m.
pub mod q5_1 {
    pub const BYTES: usize = 24;
    pub const D: usize = 0;
    pub const M: usize = 2;
    pub const QH: usize = 4;
    pub const QS: usize = 8;
}

/// Q8_0: `{ d: f16, qs: [i8; 32] }`, value = d·q.
pub mod q8_0 {
    pub const BYTES: usize = 34;
    pub const D: usize = 0;
    pub const QS: usize = 2;
}

/// Q2_K: `{ scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }`; sub-block i (16 elements) has
/// scale `scales[i] & 15` and min `scales[i] >> 4`; value = d·sc·q − dmin·m.
pub mod q2_k {
    pub const BYTES: usize = 84;
    pub const SCALES: usize = 0;
    pub const QS: usize = 16;
    pub const D: usize = 80;
    pub const DMIN: usize = 82;
}

/// Q3_K: `{ hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }`; 16 sub-blocks of 16 with
/// 6-bit scales stored biased by 32; value = d·(sc − 32)·(q2 − 4·!hbit).
pub mod q3_k {
    pub const BYTES: usize = 110;
    pub const HMASK: usize = 0;
    pub const QS: usize = 32;
    pub const SCALES: usize = 96;
    pub const D: usize = 108;
}

/// Q4_K: `{ d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`; 8 sub-blocks of 32 with 6-bit
/// scales and mins; value = d·sc·q − dmin·m.
pub mod q4_k {
    pub const BYTES: usize = 144;
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    pub const SCALES: usize = 4;
    pub const QS: usize = 16;
}

/// Q5_K: `{ d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }`.
pub mod q5_k {
    pub const BYTES: usize = 176;
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    pub const SCALES: usize = 4;
    pub const QH: usize = 16;
    pub const QS: usize = 48;
}

/// Q6_K: `{ ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`; value = d·sc·(q − 32).
pub mod q6_k {
    pub const BYTES: usize = 210;
    pub const QL: usize = 0;
    pub const QH: usize = 128;
    pub const SCALES: usize = 192;
    pub const D: usize = 208;
}

/// The 8 six-bit scales and 8 six-bit mins of a Q4_K/Q5_K block from its 12 packed bytes
/// (ggml `get_scale_min_k4`).
#[inline(always)]
pub fn k4_scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    (sc, m)
}

/// The 16 signed scales (already minus 32) of a Q3_K block from its 12 packed bytes (ggml's
/// `kmask1`/`kmask2` unpacking in `dequantize_row_q3_K`).
#[inline(always)]
pub fn q3k_scales(q: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 { q[i] & 0xF } else { q[i - 8] >> 4 };
        let high = (q[8 + (i % 4)] >> (2 * (i / 4))) & 3;
        *o = ((low | (high << 4)) as i32 - 32) as i8;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Q3_K scale unpacking written with ggml's 32-bit masks, to check the per-byte form.
    fn q3k_scales_ggml(q: &[u8]) -> [i8; 16] {
        let kmask1: u32 = 0x0303_0303;
        let kmask2: u32 = 0x0f0f_0f0f;
        let mut aux = [0u32; 4];
        for i in 0..3 {
            aux[i] = u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
        }
        let tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
        aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
        aux[0] = (aux[0] & kmask2) | ((tmp & kmask1) << 4);
        aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
        let mut out = [0i8; 16];
        for i in 0..16 {
            out[i] = ((aux[i / 4] >> (8 * (i % 4))) & 0xff) as i32 as i8 - 32;
        }
        out
    }

    #[test]
    fn q3k_scales_match_ggml_masks() {
        let mut s = 12345u32;
        for _ in 0..200 {
            let mut q = [0u8; 12];
            for b in q.iter_mut() {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                *b = (s >> 24) as u8;
            }
            assert_eq!(q3k_scales(&q), q3k_scales_ggml(&q));
        }
    }

    #[test]
    fn bf16_rounding_matches_ggml() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is a tie between 1.0 and 1 + 2^-7: rounds to even (1.0).
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
    }
}
