//! A shard's slice of one GGUF tensor, in its block format (never dequantized).
//!
//! A matrix has `dims = [k, n_out]` (ggml order): `n_out` rows of `k` elements, each row a whole
//! number of blocks. A column split takes whole rows (`Cut::Rows`): a contiguous byte range of
//! the file, borrowed without a copy. A row split takes the same K range of every row
//! (`Cut::Cols`): the blocks `k0/bs .. k1/bs` of each row, copied into one owned buffer (still
//! quantized; the cut must fall on block boundaries). A vector (`dims = [n]`: biases, norms) is
//! one row, so cutting its elements is a `Cut::Cols` of that row.
//!
//! A stack of matrices (`dims = [k, n_out, n_mat]`: a MoE layer's `ffn_{gate,up,down}_exps`, one
//! matrix per expert) is cut by whole matrices (`Cut::Stack`: contiguous, borrowed), or the same
//! way in every matrix: `Cut::StackRows` takes rows `[r0, r1)` of each (the rows `m·n_out +
//! [r0, r1)` of the flat tensor: not one contiguous range, so copied), and `Cut::Cols` the K range
//! of every row of every matrix.

use std::ops::Range;

use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Which part of a tensor a shard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// The whole tensor (replicated).
    Whole,
    /// Output rows `[r0, r1)` of a matrix, or elements `[r0, r1)` of a vector (column split: the
    /// layer's output features).
    Rows(Range<usize>),
    /// Elements `[k0, k1)` of every row of a matrix (row split: the layer's input features, K),
    /// of every matrix of a stack.
    Cols(Range<usize>),
    /// Output rows `[r0, r1)` of every matrix of a stack (`dims = [k, n_out, n_mat]`): the same
    /// columns of every expert of `ffn_gate_exps` / `ffn_up_exps`. The cut has `dims = [k, r1 −
    /// r0, n_mat]`.
    StackRows(Range<usize>),
    /// Matrices `[m0, m1)` of a stack (`dims = [k, n_out, n_mat]`): whole experts of a MoE
    /// layer. The cut has `dims = [k, n_out, m1 − m0]`.
    Stack(Range<usize>),
}

/// The bytes of a cut: a borrowed range of the tensor's data, or blocks gathered into a new buffer.
#[derive(Debug)]
pub enum Sliced<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Sliced<'_> {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Sliced::Borrowed(b) => b,
            Sliced::Owned(v) => v,
        }
    }
}

/// Cuts `cut` out of tensor `name` (`wtype` blocks, `dims` in ggml order, `data` its bytes).
/// Returns the cut's dims (ggml order) and bytes. `n_shards` only goes into errors.
///
/// Errors: [`FakError::Shard`] naming the tensor, its format and `n_shards` when a K range does
/// not start and end on the format's block boundaries; [`FakError::Model`] when a range is outside
/// the tensor or the data length does not match its shape.
pub fn cut<'a>(name: &str, wtype: GgmlType, dims: &[usize], data: &'a [u8], cut: &Cut, n_shards: usize) -> Result<(Vec<usize>, Sliced<'a>)> {
    let k = dims.first().copied().unwrap_or(1);
    let n_out: usize = dims.iter().skip(1).product();
    let (bs, ts) = wtype.block_geometry();
    let row_bytes = (k / bs) * ts;
    if !k.is_multiple_of(bs) || data.len() != row_bytes * n_out {
        return Err(FakError::model(format!(
            "tensor {name}: {} bytes do not hold {n_out} rows of {k} {} elements",
            data.len(),
            wtype.name()
        )));
    }
    let out_of_range = |r: &Range<usize>, len: usize, what: &str| {
        FakError::model(format!("tensor {name}: {what} {}..{} is outside 0..{len}", r.start, r.end))
    };
    match cut {
        Cut::Whole => Ok((dims.to_vec(), Sliced::Borrowed(data))),
        Cut::Rows(r) if dims.len() >= 2 => {
            if r.start > r.end || r.end > n_out {
                return Err(out_of_range(r, n_out, "rows"));
            }
            let mut d = dims.to_vec();
            d[1..].fill(1);
            d[1] = r.len();
            Ok((d, Sliced::Borrowed(&data[r.start * row_bytes..r.end * row_bytes])))
        }
        Cut::Stack(r) => {
            if dims.len() != 3 {
                return Err(FakError::model(format!("tensor {name}: dims {dims:?} are not a stack of matrices")));
            }
            if r.start > r.end || r.end > dims[2] {
                return Err(out_of_range(r, dims[2], "matrices"));
            }
            let per = dims[1] * row_bytes;
            Ok((vec![k, dims[1], r.len()], Sliced::Borrowed(&data[r.start * per..r.end * per])))
        }
        Cut::StackRows(r) => {
            if dims.len() != 3 {
                return Err(FakError::model(format!("tensor {name}: dims {dims:?} are not a stack of matrices")));
            }
            let per = dims[1];
            if r.start > r.end || r.end > per {
                return Err(out_of_range(r, per, "rows of each matrix"));
            }
            let mut out = Vec::with_capacity(r.len() * row_bytes * dims[2]);
            for m in data.chunks_exact(per * row_bytes) {
                out.extend_from_slice(&m[r.start * row_bytes..r.end * row_bytes]);
            }
            Ok((vec![k, r.len(), dims[2]], Sliced::Owned(out)))
        }
        // A vector's elements are one row's K range.
        Cut::Rows(r) | Cut::Cols(r) => {
            if r.start > r.end || r.end > k {
                return Err(out_of_range(r, k, "elements"));
            }
            if r.start % bs != 0 || (r.end % bs != 0 && r.end != k) {
                return Err(FakError::shard(
                    name,
                    wtype.name(),
                    n_shards,
                    format!("K range {}..{} of {k} does not fall on its {bs}-element blocks", r.start, r.end),
                ));
            }
            let (b0, b1) = (r.start / bs * ts, r.end.div_ceil(bs) * ts);
            let mut out = Vec::with_capacity((b1 - b0) * n_out);
            for row in data.chunks_exact(row_bytes) {
                out.extend_from_slice(&row[b0..b1]);
            }
            let mut d = dims.to_vec();
            d[0] = r.len();
            Ok((d, Sliced::Owned(out)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// `n_out` rows of `k` valid Q8_0 blocks: scale 1/64 (f16 0x2400), quants from a counter.
    fn q8_0_rows(n_out: usize, k: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let mut c = 0u8;
        for _ in 0..n_out * k / 32 {
            v.extend_from_slice(&0x2400u16.to_le_bytes());
            for _ in 0..32 {
                v.push(c);
                c = c.wrapping_add(37);
            }
        }
        v
    }

    fn deq(t: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        dequantize(t, b, &mut out).unwrap();
        out
    }

    #[test]
    fn rows_borrow_the_blocks_of_whole_rows() {
        let (n_out, k) = (6, 64);
        let data = q8_0_rows(n_out, k);
        let (d, s) = cut("w", GgmlType::Q8_0, &[k, n_out], &data, &Cut::Rows(2..5), 2).unwrap();
        assert_eq!(d, vec![64, 3]);
        assert!(matches!(s, Sliced::Borrowed(_)));
        let full = deq(GgmlType::Q8_0, &data, n_out * k);
        assert_eq!(deq(GgmlType::Q8_0, s.bytes(), 3 * k), full[2 * k..5 * k]);
    }

    #[test]
    fn cols_gather_the_same_blocks_of_every_row_bit_for_bit() {
        let (n_out, k) = (5, 128);
        let data = q8_0_rows(n_out, k);
        let (d, s) = cut("w", GgmlType::Q8_0, &[k, n_out], &data, &Cut::Cols(32..96), 2).unwrap();
        assert_eq!(d, vec![64, 5]);
        let full = deq(GgmlType::Q8_0, &data, n_out * k);
        let part = deq(GgmlType::Q8_0, s.bytes(), n_out * 64);
        for r in 0..n_out {
            assert_eq!(part[r * 64..(r + 1) * 64], full[r * k + 32..r * k + 96]);
        }
    }

    #[test]
    fn cols_inside_a_block_are_a_shard_error() {
        let data = q8_0_rows(2, 64);
        let e = cut("blk.3.ffn_down.weight", GgmlType::Q8_0, &[64, 2], &data, &Cut::Cols(0..48), 4).unwrap_err();
        match e {
            FakError::Shard { tensor, format, n_shards, .. } => {
                assert_eq!((tensor.as_str(), format.as_str(), n_shards), ("blk.3.ffn_down.weight", "Q8_0", 4))
            }
            other => panic!("{other}"),
        }
        // k-quant: 256-element blocks; a cut at 128 is inside one
        let q4k = vec![0u8; 2 * 144 * 2];
        assert!(matches!(
            cut("x", GgmlType::Q4_K, &[512, 2], &q4k, &Cut::Cols(128..512), 2),
            Err(FakError::Shard { .. })
        ));
        let (d, s) = cut("x", GgmlType::Q4_K, &[512, 2], &q4k, &Cut::Cols(256..512), 2).unwrap();
        assert_eq!((d, s.bytes().len()), (vec![256, 2], 2 * 144));
    }

    #[test]
    fn stacks_cut_whole_matrices_the_same_rows_of_every_matrix_or_every_rows_k_range() {
        // 3 matrices (experts) of 4 rows of 64: the rows 1..3 of each, and K 32..64 of each row.
        let (k, n_out, n_mat) = (64, 4, 3);
        let data = q8_0_rows(n_out * n_mat, k);
        let full = deq(GgmlType::Q8_0, &data, n_out * n_mat * k);
        let (d, s) = cut("blk.0.ffn_up_exps.weight", GgmlType::Q8_0, &[k, n_out, n_mat], &data, &Cut::StackRows(1..3), 2).unwrap();
        assert_eq!(d, vec![64, 2, 3]);
        let part = deq(GgmlType::Q8_0, s.bytes(), 2 * n_mat * k);
        for m in 0..n_mat {
            for r in 0..2 {
                let src = (m * n_out + 1 + r) * k;
                assert_eq!(part[(m * 2 + r) * k..(m * 2 + r + 1) * k], full[src..src + k], "matrix {m} row {r}");
            }
        }
        let (d, s) = cut("blk.0.ffn_down_exps.weight", GgmlType::Q8_0, &[k, n_out, n_mat], &data, &Cut::Cols(32..64), 2).unwrap();
        assert_eq!(d, vec![32, 4, 3]);
        let part = deq(GgmlType::Q8_0, s.bytes(), n_out * n_mat * 32);
        for row in 0..n_out * n_mat {
            assert_eq!(part[row * 32..(row + 1) * 32], full[row * k + 32..(row + 1) * k]);
        }
        let (d, s) = cut("blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, &[k, n_out, n_mat], &data, &Cut::Stack(1..3), 2).unwrap();
        assert_eq!(d, vec![64, 4, 2]);
        assert!(matches!(s, Sliced::Borrowed(_)));
        assert_eq!(deq(GgmlType::Q8_0, s.bytes(), 2 * n_out * k), full[n_out * k..]);
        assert!(matches!(cut("w", GgmlType::Q8_0, &[k, n_out, n_mat], &data, &Cut::Stack(2..4), 2), Err(FakError::Model(_))));
        // not a stack, or rows past a matrix's end
        assert!(matches!(cut("w", GgmlType::Q8_0, &[k, 12], &data, &Cut::StackRows(0..2), 2), Err(FakError::Model(_))));
        assert!(matches!(cut("w", GgmlType::Q8_0, &[k, n_out, n_mat], &data, &Cut::StackRows(3..5), 2), Err(FakError::Model(_))));
    }

    #[test]
    fn vector_elements_are_cut_like_one_row() {
        let v: Vec<u8> = (0..10).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let (d, s) = cut("b", GgmlType::F32, &[10], &v, &Cut::Rows(3..7), 2).unwrap();
        assert_eq!(d, vec![4]);
        assert_eq!(deq(GgmlType::F32, s.bytes(), 4), vec![3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn out_of_range_is_a_model_error() {
        let data = q8_0_rows(2, 32);
        assert!(matches!(cut("w", GgmlType::Q8_0, &[32, 2], &data, &Cut::Rows(1..3), 2), Err(FakError::Model(_))));
    }
}
