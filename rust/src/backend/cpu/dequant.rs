//! TEMPORARY bridge to `crate::quant::dequantize_row` until the GGUF/quant work is merged:
//! F32 and F16 only.

use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Dequantizes `src` blocks of type `t` into `dst` (sequential).
pub fn dequantize(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    match t {
        GgmlType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
            Ok(())
        }
        GgmlType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
            Ok(())
        }
        t => Err(FakError::Unsupported(format!("dequantize {}", t.name()))),
    }
}

/// TEMPORARY: `y[r, o] = Σ_i W[o, i] · x[r, i]` by dequantizing each weight row (F32/F16 only),
/// until the SIMD quantized matmul is merged.
pub fn matmul(wtype: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize, y: &mut [f32]) -> Result<()> {
    let rb = wtype.row_bytes(k as u64).unwrap_or(0) as usize;
    let mut row = vec![0f32; k];
    for o in 0..n_out {
        dequantize(wtype, &w[o * rb..(o + 1) * rb], &mut row)?;
        for r in 0..n_rows {
            y[r * n_out + o] = row.iter().zip(&x[r * k..(r + 1) * k]).map(|(a, b)| a * b).sum();
        }
    }
    Ok(())
}
