//! Q6_K: 256 elements in 210 bytes, 6-bit k-quant: 16 sub-blocks of 16 elements, each with a
//! signed 8-bit scale (ggml `block_q6_K` in `ggml-common.h`, `dequantize_row_q6_K` in
//! `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0   128  ql[128]     low 4 bits of the quants
//!    128    64  qh[64]      high 2 bits, four per byte
//!    192    16  scales[16]  i8 sub-block scales
//!    208     2  d           f16 super-block scale
//! for half h in 0..2, l in 0..32 (L = ql[64h..], H = qh[32h..], S = scales[8h..], s = l/16):
//!     y[128h + l]      = (d * S[s])     * (((L[l]      & 0xF) | ((H[l] >> 0) & 3) << 4) - 32)
//!     y[128h + l + 32] = (d * S[s + 2]) * (((L[l + 32] & 0xF) | ((H[l] >> 2) & 3) << 4) - 32)
//!     y[128h + l + 64] = (d * S[s + 4]) * (((L[l]      >> 4)  | ((H[l] >> 4) & 3) << 4) - 32)
//!     y[128h + l + 96] = (d * S[s + 6]) * (((L[l + 32] >> 4)  | ((H[l] >> 6) & 3) << 4) - 32)
//! ```

use super::fp16::f16_to_f32;
use super::{for_each_block, QK_K};

/// Elements per block (`QK_K`).
pub const BLOCK_ELEMS: usize = QK_K;
/// Bytes per block (`sizeof(block_q6_K)`).
pub const BLOCK_BYTES: usize = 210;

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let d = f16_to_f32([b[208], b[209]]);
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &b[192 + 8 * h..192 + 8 * h + 8];
        let out = &mut y[128 * h..128 * h + 128];
        for s in 0..2 {
            let ds = [
                d * sc[s] as i8 as f32,
                d * sc[s + 2] as i8 as f32,
                d * sc[s + 4] as i8 as f32,
                d * sc[s + 6] as i8 as f32,
            ];
            for l in 16 * s..16 * s + 16 {
                let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                out[l] = ds[0] * q1 as f32;
                out[l + 32] = ds[1] * q2 as f32;
                out[l + 64] = ds[2] * q3 as f32;
                out[l + 96] = ds[3] * q4 as f32;
            }
        }
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
