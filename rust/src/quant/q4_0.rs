//! Q4_0: 32 elements in 18 bytes, symmetric 4-bit (ggml `block_q4_0` in `ggml-common.h`,
//! `dequantize_row_q4_0` in `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0     2  d       f16 scale
//!      2    16  qs[16]  element j in the low nibble of qs[j], element j+16 in the high nibble
//! y[j]    = ((qs[j] & 0xF) - 8) * d
//! y[j+16] = ((qs[j] >> 4)  - 8) * d
//! ```

use super::for_each_block;
use super::fp16::f16_to_f32;

/// Elements per block (`QK4_0`).
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block (`sizeof(block_q4_0)`).
pub const BLOCK_BYTES: usize = 18;

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let d = f16_to_f32([b[0], b[1]]);
    let qs = &b[2..18];
    let (lo, hi) = y.split_at_mut(16);
    for j in 0..16 {
        lo[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        hi[j] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
