//! Q4_K: 256 elements in 144 bytes, 4-bit k-quant: 8 sub-blocks of 32 elements, each with a 6-bit
//! scale and a 6-bit minimum (ggml `block_q4_K` in `ggml-common.h`, `dequantize_row_q4_K` and
//! `get_scale_min_k4` in `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0     2  d           f16 super-block scale of the scales
//!      2     2  dmin        f16 super-block scale of the mins
//!      4    12  scales[12]  8 six-bit scales and 8 six-bit mins, see [`get_scale_min_k4`]
//!     16   128  qs[128]     4-bit quants
//! for pair p in 0..4, l in 0..32:
//!     (sc0, m0) = get_scale_min_k4(2p), (sc1, m1) = get_scale_min_k4(2p + 1)
//!     y[64p + l]      = (d * sc0) * (qs[32p + l] & 0xF) - dmin * m0
//!     y[64p + 32 + l] = (d * sc1) * (qs[32p + l] >> 4)  - dmin * m1
//! ```

use super::fp16::f16_to_f32;
use super::{for_each_block, QK_K};

/// Elements per block (`QK_K`).
pub const BLOCK_ELEMS: usize = QK_K;
/// Bytes per block (`sizeof(block_q4_K)`).
pub const BLOCK_BYTES: usize = 144;
/// Bytes of packed scales and mins (`K_SCALE_SIZE`), shared with Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Scale and minimum (6 bits each) of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K /
/// Q5_K block (ggml `get_scale_min_k4`): for j < 4 the low 6 bits of `q[j]` and `q[j + 4]`; for
/// j >= 4 the nibbles of `q[j + 4]` with the top 2 bits of `q[j - 4]` and `q[j]`.
#[inline(always)]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let d = f16_to_f32([b[0], b[1]]);
    let min = f16_to_f32([b[2], b[3]]);
    let mut scales = [0u8; K_SCALE_SIZE];
    scales.copy_from_slice(&b[4..16]);
    let qs = &b[16..144];
    for p in 0..4 {
        let (sc0, m0) = get_scale_min_k4(2 * p, &scales);
        let (sc1, m1) = get_scale_min_k4(2 * p + 1, &scales);
        let (d0, m0) = (d * sc0 as f32, min * m0 as f32);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let q = &qs[32 * p..32 * p + 32];
        let (lo, hi) = y[64 * p..64 * p + 64].split_at_mut(32);
        for l in 0..32 {
            lo[l] = d0 * (q[l] & 0x0F) as f32 - m0;
            hi[l] = d1 * (q[l] >> 4) as f32 - m1;
        }
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
