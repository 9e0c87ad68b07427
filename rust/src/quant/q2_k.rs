//! Q2_K: 256 elements in 84 bytes, 2-bit k-quant: 16 sub-blocks of 16 elements, each with a 4-bit
//! scale and a 4-bit minimum (ggml `block_q2_K` in `ggml-common.h`, `dequantize_row_q2_K` in
//! `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0    16  scales[16]  sub-block s: scale = scales[s] & 0xF, min = scales[s] >> 4
//!     16    64  qs[64]      2-bit quants, four per byte
//!     80     2  d           f16 super-block scale of the scales
//!     82     2  dmin        f16 super-block scale of the mins
//! for half h in 0..2, shift k in 0..4, l in 0..32:   (element e = 128h + 32k + l)
//!     q = (qs[32h + l] >> 2k) & 3,   s = 8h + 2k + l/16
//!     y[e] = (d * (scales[s] & 0xF)) * q - dmin * (scales[s] >> 4)
//! ```

use super::fp16::f16_to_f32;
use super::{for_each_block, QK_K};

/// Elements per block (`QK_K`).
pub const BLOCK_ELEMS: usize = QK_K;
/// Bytes per block (`sizeof(block_q2_K)`).
pub const BLOCK_BYTES: usize = 84;

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let scales = &b[0..16];
    let d = f16_to_f32([b[80], b[81]]);
    let min = f16_to_f32([b[82], b[83]]);
    for h in 0..2 {
        let q = &b[16 + 32 * h..16 + 32 * h + 32];
        for k in 0..4 {
            let shift = 2 * k;
            for half in 0..2 {
                let sc = scales[8 * h + 2 * k + half];
                let dl = d * (sc & 0x0F) as f32;
                let ml = min * (sc >> 4) as f32;
                let out = &mut y[128 * h + 32 * k + 16 * half..][..16];
                let qq = &q[16 * half..16 * half + 16];
                for l in 0..16 {
                    out[l] = dl * (((qq[l] as u32) >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
