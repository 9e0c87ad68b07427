//! Q8_0: 32 elements in 34 bytes, symmetric 8-bit (ggml `block_q8_0` in `ggml-common.h`,
//! `dequantize_row_q8_0` in `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0     2  d       f16 scale
//!      2    32  qs[32]  i8 quants
//! y[j] = qs[j] * d
//! ```

use super::for_each_block;
use super::fp16::f16_to_f32;

/// Elements per block (`QK8_0`).
pub const BLOCK_ELEMS: usize = 32;
/// Bytes per block (`sizeof(block_q8_0)`).
pub const BLOCK_BYTES: usize = 34;

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = q as i8 as f32 * d;
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
