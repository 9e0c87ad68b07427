//! Q5_1: 32 elements in 24 bytes, 5-bit with a scale and a minimum (ggml `block_q5_1` in
//! `ggml-common.h`, `dequantize_row_q5_1` in `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0     2  d       f16 scale
//!      2     2  m       f16 minimum
//!      4     4  qh      u32 (little-endian): bit j is the 5th bit of element j
//!      8    16  qs[16]  low 4 bits: element j in the low nibble of qs[j], j+16 in the high nibble
//! y[j]    = ((qs[j] & 0xF) | bit(qh, j)    << 4) * d + m
//! y[j+16] = ((qs[j] >> 4)  | bit(qh, j+16) << 4) * d + m
//! ```

use super::for_each_block;
use super::fp16::f16_to_f32;

/// Elements per block (`QK5_1`).
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block (`sizeof(block_q5_1)`).
pub const BLOCK_BYTES: usize = 24;

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let d = f16_to_f32([b[0], b[1]]);
    let m = f16_to_f32([b[2], b[3]]);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    let (lo, hi) = y.split_at_mut(16);
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        lo[j] = ((qs[j] & 0x0F) as u32 | h0) as f32 * d + m;
        hi[j] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
