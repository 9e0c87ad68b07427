//! BF16: bfloat16 (the top 16 bits of an IEEE-754 binary32), little-endian, one element per
//! 2-byte "block" (ggml `GGML_TYPE_BF16`, `ggml_bf16_t`; `ggml_compute_bf16_to_fp32` in
//! `ggml-impl.h`): `y = f32::from_bits((x as u32) << 16)`, exact.

/// Elements per block.
pub const BLOCK_ELEMS: usize = 1;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 2;

/// Widens as many whole bf16 values as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for (s, d) in src.chunks_exact(BLOCK_BYTES).zip(dst.iter_mut()) {
        *d = f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16);
    }
}
