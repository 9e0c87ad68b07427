//! F16: IEEE-754 binary16, little-endian, one element per 2-byte "block" (ggml `GGML_TYPE_F16`,
//! `ggml_fp16_t`). Widening to f32 is exact (subnormals, inf and NaN included).

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 1;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 2;

/// One little-endian f16 widened to f32 (`GGML_FP16_TO_FP32`).
#[inline(always)]
pub fn f16_to_f32(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// Widens as many whole f16 values as both slices hold. Works in chunks through a stack buffer so
/// the conversion runs on `half`'s vectorized (F16C when the CPU has it) slice path.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    const CHUNK: usize = 256;
    let mut buf = [f16::ZERO; CHUNK];
    for (s, d) in src.chunks(CHUNK * BLOCK_BYTES).zip(dst.chunks_mut(CHUNK)) {
        let n = (s.len() / BLOCK_BYTES).min(d.len());
        for (h, b) in buf[..n].iter_mut().zip(s.chunks_exact(BLOCK_BYTES)) {
            *h = f16::from_le_bytes([b[0], b[1]]);
        }
        buf[..n].convert_to_f32_slice(&mut d[..n]);
    }
}
