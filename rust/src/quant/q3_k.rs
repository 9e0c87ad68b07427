//! Q3_K: 256 elements in 110 bytes, 3-bit k-quant: 16 sub-blocks of 16 elements, each with a
//! signed 6-bit scale (ggml `block_q3_K` in `ggml-common.h`, `dequantize_row_q3_K` in
//! `ggml-quants.c`).
//!
//! ```text
//! offset  size  field
//!      0    32  hmask[32]   high bit of each quant: bit k of hmask[l] for element 32k + l
//!     32    64  qs[64]      low 2 bits, four per byte
//!     96    12  scales[12]  16 six-bit scales, see [`unpack_scales`]
//!    108     2  d           f16 super-block scale
//! for half h in 0..2, shift k in 0..4, l in 0..32:   (element e = 128h + 32k + l)
//!     q = ((qs[32h + l] >> 2k) & 3) - (bit(hmask[l], 4h + k) ? 0 : 4)
//!     y[e] = (d * (scale[8h + 2k + l/16] - 32)) * q
//! ```

use super::fp16::f16_to_f32;
use super::{for_each_block, QK_K};

/// Elements per block (`QK_K`).
pub const BLOCK_ELEMS: usize = QK_K;
/// Bytes per block (`sizeof(block_q3_K)`).
pub const BLOCK_BYTES: usize = 110;

/// Unpacks the 16 six-bit scales of a Q3_K block (still biased by 32: subtract 32 for the signed
/// value). Scale `i` has its low 4 bits in the low nibble of `scales[i]` (i < 8) or the high
/// nibble of `scales[i - 8]` (i >= 8), and its high 2 bits at bits `2 * (i / 4)` of
/// `scales[8 + i % 4]` (the `kmask1`/`kmask2` shuffle of `dequantize_row_q3_K`).
#[inline(always)]
pub fn unpack_scales(scales: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 {
            scales[i] & 0x0F
        } else {
            scales[i - 8] >> 4
        };
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        *o = low | (high << 4);
    }
    out
}

/// Dequantizes one block.
#[inline(always)]
pub fn dequantize_block(b: &[u8; BLOCK_BYTES], y: &mut [f32; BLOCK_ELEMS]) {
    let hmask = &b[0..32];
    let mut sc = [0u8; 12];
    sc.copy_from_slice(&b[96..108]);
    let scales = unpack_scales(&sc);
    let d = f16_to_f32([b[108], b[109]]);
    for h in 0..2 {
        let q = &b[32 + 32 * h..32 + 32 * h + 32];
        for k in 0..4 {
            let shift = 2 * k;
            let m = 1u8 << (4 * h + k);
            for half in 0..2 {
                let dl = d * (scales[8 * h + 2 * k + half] as i32 - 32) as f32;
                let out = &mut y[128 * h + 32 * k + 16 * half..][..16];
                let qq = &q[16 * half..16 * half + 16];
                let hm = &hmask[16 * half..16 * half + 16];
                for l in 0..16 {
                    let v = (((qq[l] as i32) >> shift) & 3) - (((hm[l] & m) == 0) as i32) * 4;
                    out[l] = dl * v as f32;
                }
            }
        }
    }
}

/// Dequantizes as many whole blocks as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for_each_block(src, dst, dequantize_block);
}
