//! Fuzz target: every dequantizer on arbitrary bytes. The first byte picks the type; the rest is
//! cut to whole blocks. The parallel and the serial path must agree bit for bit (NaN-aware).
#![no_main]

use fak::quant::{self, GgmlType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let supported: Vec<GgmlType> = GgmlType::ALL.iter().copied().filter(|&t| quant::can_dequantize(t)).collect();
    let t = supported[pick as usize % supported.len()];
    let (bs, ts) = t.block_geometry();
    let n_blocks = rest.len() / ts;
    // repeat the input so that some cases take the parallel path
    let reps = if pick & 0x80 != 0 { quant::PARALLEL_MIN_ELEMS / (n_blocks * bs).max(1) + 1 } else { 1 };
    let src: Vec<u8> = rest[..n_blocks * ts].repeat(reps);
    let mut a = vec![0f32; n_blocks * reps * bs];
    let mut b = vec![0f32; n_blocks * reps * bs];
    quant::dequantize(t, &src, &mut a).unwrap();
    quant::dequantize_row(t, &src, &mut b).unwrap();
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())));
    // a wrong length is an error, never a panic
    if !src.is_empty() {
        assert!(quant::dequantize(t, &src[1..], &mut a).is_err());
    }
});
