//! Q5_K: 256 elements in 176 bytes, 5-bit k-quant: 8 sub-blocks of 32 elements, each with a 6-bit
//! scale and a 6-bit minimum packed as in Q4_K (ggml `block_q5_K` in `ggml-common.h`,
//! `dequantize_row_q5_K` in `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0     2  d           f16 super-block scale of the scales
//!      2     2  dmin        f16 super-block scale of the mins
//!      4    12  scales[12]  as Q4_K ([`super::q4_k::get_scale_min_k4`])
//!     16    32  qh[32]      5th bits: bit 2p of qh[l] for element 64p + l, bit 2p+1 for 64p + 32 + l
//!     48   128  qs[128]     low 4 bits
//! for pair p in 0..4, l in 0..32:
//!     y[64p + l]      = (d * sc0) * ((qs[32p + l] & 0xF) + 16 * bit(qh[l], 2p))     - dmin * m0
//!     y[64p + 32 + l] = (d * sc1) * ((qs[32p + l] >> 4)  + 16 * bit(qh[l], 2p + 1)) - dmin * m1
//! ```

use super::fp16::f16_to_f32;
use super::q4_k::{get_scale_min_k4, K_SCALE_SIZE};
use super::{for_each_block, QK_K};

/// Elements per block (`QK_K`).
pub const BLOCK_ELEMS: usize = QK_K;
/// Bytes per block (`sizeof(block_q5_K)`).
pub const BLOCK_BYTES: usize = 176;

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let d = f16_to_f32([b[0], b[1]]);
    let min = f16_to_f32([b[2], b[3]]);
    let mut scales = [0u8; K_SCALE_SIZE];
    scales.copy_from_slice(&b[4..16]);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for p in 0..4 {
        let (sc0, m0) = get_scale_min_k4(2 * p, &scales);
        let (sc1, m1) = get_scale_min_k4(2 * p + 1, &scales);
        let (d0, m0) = (d * sc0 as f32, min * m0 as f32);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let u0 = 1u8 << (2 * p);
        let u1 = 2u8 << (2 * p);
        let q = &qs[32 * p..32 * p + 32];
        let (lo, hi) = y[64 * p..64 * p + 64].split_at_mut(32);
        for l in 0..32 {
            let h0 = if qh[l] & u0 != 0 { 16 } else { 0 };
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            lo[l] = d0 * ((q[l] & 0x0F) + h0) as f32 - m0;
            hi[l] = d1 * ((q[l] >> 4) + h1) as f32 - m1;
        }
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
