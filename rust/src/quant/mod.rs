//! ggml tensor types: ids, block geometry and names, as in ggml's `ggml.h` / `ggml-common.h`
//! (and the GGUF spec, which stores the id as a u32 in each tensor info).
//!
//! One sub-module per block format holds its layout and dequantization; [`dequantize`] dispatches
//! on the type. Every format's arithmetic follows ggml's `dequantize_row_*` (`ggml-quants.c`)
//! operation for operation, so results are bit-identical to ggml and to the `gguf` package's
//! `gguf.quants.dequantize`.

pub mod bf16;
pub mod fp16;
pub mod fp32;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;

use rayon::prelude::*;

use crate::{FakError, Result};

/// A ggml tensor type. The discriminant is the id written in GGUF tensor infos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
}

/// Elements per super-block of the k-quants (`QK_K` in ggml).
pub const QK_K: usize = 256;

impl GgmlType {
    /// All known types, in id order.
    pub const ALL: [GgmlType; 32] = [
        GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
        GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
        GgmlType::Q6_K, GgmlType::Q8_K, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ3_XXS,
        GgmlType::IQ1_S, GgmlType::IQ4_NL, GgmlType::IQ3_S, GgmlType::IQ2_S, GgmlType::IQ4_XS,
        GgmlType::I8, GgmlType::I16, GgmlType::I32, GgmlType::I64, GgmlType::F64, GgmlType::IQ1_M,
        GgmlType::BF16, GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::MXFP4,
    ];

    /// The type with GGUF id `id`, or `None` for an id ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// The type named `name` (ggml's spelling, e.g. `"Q4_K"`, case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        Self::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// ggml's name of the type (`"Q4_K"`, `"F16"`, ...), as the `gguf` package spells it.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32", F16 => "F16", Q4_0 => "Q4_0", Q4_1 => "Q4_1", Q5_0 => "Q5_0", Q5_1 => "Q5_1",
            Q8_0 => "Q8_0", Q8_1 => "Q8_1", Q2_K => "Q2_K", Q3_K => "Q3_K", Q4_K => "Q4_K", Q5_K => "Q5_K",
            Q6_K => "Q6_K", Q8_K => "Q8_K", IQ2_XXS => "IQ2_XXS", IQ2_XS => "IQ2_XS", IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S", IQ4_NL => "IQ4_NL", IQ3_S => "IQ3_S", IQ2_S => "IQ2_S", IQ4_XS => "IQ4_XS",
            I8 => "I8", I16 => "I16", I32 => "I32", I64 => "I64", F64 => "F64", IQ1_M => "IQ1_M",
            BF16 => "BF16", TQ1_0 => "TQ1_0", TQ2_0 => "TQ2_0", MXFP4 => "MXFP4",
        }
    }

    /// (elements per block, bytes per block), from ggml's `type_traits` table.
    pub fn block_geometry(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4), F16 => (1, 2), BF16 => (1, 2), F64 => (1, 8),
            I8 => (1, 1), I16 => (1, 2), I32 => (1, 4), I64 => (1, 8),
            Q4_0 => (32, 18), Q4_1 => (32, 20), Q5_0 => (32, 22), Q5_1 => (32, 24),
            Q8_0 => (32, 34), Q8_1 => (32, 36),
            Q2_K => (256, 84), Q3_K => (256, 110), Q4_K => (256, 144), Q5_K => (256, 176),
            Q6_K => (256, 210), Q8_K => (256, 292),
            IQ2_XXS => (256, 66), IQ2_XS => (256, 74), IQ3_XXS => (256, 98), IQ1_S => (256, 50),
            IQ4_NL => (32, 18), IQ3_S => (256, 110), IQ2_S => (256, 82), IQ4_XS => (256, 136),
            IQ1_M => (256, 56), TQ1_0 => (256, 54), TQ2_0 => (256, 66), MXFP4 => (32, 17),
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.block_geometry().0
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.block_geometry().1
    }

    /// Bytes taken by `n_elements` elements of this type, or `None` if `n_elements` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, n_elements: u64) -> Option<u64> {
        let (bs, ts) = self.block_geometry();
        if n_elements % bs as u64 != 0 {
            return None;
        }
        (n_elements / bs as u64).checked_mul(ts as u64)
    }
}

/// Runs `f` over each whole block of `src` and the matching `BE` outputs of `dst` (as many blocks
/// as both slices hold).
#[inline(always)]
pub(crate) fn for_each_block<const BB: usize, const BE: usize>(
    src: &[u8],
    dst: &mut [f32],
    f: impl Fn(&[u8; BB], &mut [f32; BE]),
) {
    for (s, d) in src.chunks_exact(BB).zip(dst.chunks_exact_mut(BE)) {
        // chunks_exact yields slices of exactly BB / BE items, so both conversions succeed.
        if let (Ok(s), Ok(d)) = (<&[u8; BB]>::try_from(s), <&mut [f32; BE]>::try_from(d)) {
            f(s, d);
        }
    }
}

/// A serial dequantizer over whole blocks: `(src blocks, dst elements)`.
pub type DequantizeFn = fn(&[u8], &mut [f32]);

/// The serial block dequantizer of `t`, or `None` for a type fak cannot dequantize.
pub fn dequantize_fn(t: GgmlType) -> Option<DequantizeFn> {
    use GgmlType::*;
    Some(match t {
        F32 => fp32::dequantize_blocks,
        F16 => fp16::dequantize_blocks,
        BF16 => bf16::dequantize_blocks,
        Q4_0 => q4_0::dequantize_blocks,
        Q4_1 => q4_1::dequantize_blocks,
        Q5_0 => q5_0::dequantize_blocks,
        Q5_1 => q5_1::dequantize_blocks,
        Q8_0 => q8_0::dequantize_blocks,
        Q2_K => q2_k::dequantize_blocks,
        Q3_K => q3_k::dequantize_blocks,
        Q4_K => q4_k::dequantize_blocks,
        Q5_K => q5_k::dequantize_blocks,
        Q6_K => q6_k::dequantize_blocks,
        _ => return None,
    })
}

/// True when [`dequantize`] supports `t`.
pub fn can_dequantize(t: GgmlType) -> bool {
    dequantize_fn(t).is_some()
}

/// Below this many output elements [`dequantize`] stays on the calling thread.
pub const PARALLEL_MIN_ELEMS: usize = 1 << 16;
/// Output elements per rayon task in [`dequantize`] (rounded to whole blocks).
const TASK_ELEMS: usize = 1 << 15;

fn check_lengths(t: GgmlType, src: &[u8], dst: &[f32]) -> Result<DequantizeFn> {
    let f = dequantize_fn(t).ok_or_else(|| {
        FakError::Unsupported(format!("dequantization of ggml type {}", t.name()))
    })?;
    let (bs, ts) = t.block_geometry();
    if src.len() % ts != 0 {
        return Err(FakError::invalid(
            "src",
            format!(
                "{} bytes is not a whole number of {} blocks ({ts} bytes each)",
                src.len(),
                t.name()
            ),
        ));
    }
    let n_blocks = src.len() / ts;
    if n_blocks.checked_mul(bs) != Some(dst.len()) {
        return Err(FakError::invalid(
            "dst",
            format!(
                "{} {} blocks hold {} elements but dst has {}",
                n_blocks,
                t.name(),
                n_blocks.saturating_mul(bs),
                dst.len()
            ),
        ));
    }
    Ok(f)
}

/// Dequantizes `src` (whole blocks of type `t`) into `dst` (f32, `n_blocks * block_size`
/// elements), on the rayon pool of the caller when `dst` has at least [`PARALLEL_MIN_ELEMS`]
/// elements. Bit-identical to ggml's `dequantize_row_*`.
///
/// Errors: [`FakError::Unsupported`] for a type without a dequantizer here (the IQ formats,
/// Q8_1, Q8_K, integer types); [`FakError::InvalidArgument`] when `src` is not whole blocks or
/// `dst` has the wrong length.
pub fn dequantize(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let f = check_lengths(t, src, dst)?;
    if dst.len() < PARALLEL_MIN_ELEMS {
        f(src, dst);
        return Ok(());
    }
    let (bs, ts) = t.block_geometry();
    let blocks_per_task = (TASK_ELEMS / bs).max(1);
    src.par_chunks(blocks_per_task * ts)
        .zip(dst.par_chunks_mut(blocks_per_task * bs))
        .for_each(|(s, d)| f(s, d));
    Ok(())
}

/// Like [`dequantize`] but always on the calling thread: for callers that already split the work
/// (one row, or rows spread over their own rayon tasks).
pub fn dequantize_row(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let f = check_lengths(t, src, dst)?;
    f(src, dst);
    Ok(())
}

#[cfg(test)]
mod dequant_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
    }
}
