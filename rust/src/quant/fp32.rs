//! F32: IEEE-754 binary32, little-endian, one element per 4-byte "block" (ggml `GGML_TYPE_F32`).

/// Elements per block.
pub const BLOCK_ELEMS: usize = 1;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 4;

/// `y[i] = f32::from_le_bytes(x[4i..4i+4])` for as many whole elements as both slices hold.
pub fn dequantize_blocks(src: &[u8], dst: &mut [f32]) {
    for (s, d) in src.chunks_exact(BLOCK_BYTES).zip(dst.iter_mut()) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}
