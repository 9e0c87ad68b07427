//! Unit tests: every format × every SIMD level this CPU runs agrees with the scalar kernels, on
//! random valid blocks and odd shapes; argument errors never panic.
//!
//! To add a format: list it in `FORMATS` with the byte offsets of its f16 scale fields.
//! (The independent check against a float64 reference from `gguf.quants.dequantize` is
//! `tests/test_cpu_matmul.py`.)

use super::*;

/// (type, byte offsets of the f16 fields inside one block that must hold finite scales).
const FORMATS: &[(GgmlType, &[usize])] = &[
    (GgmlType::Q4_0, &[0]),
    (GgmlType::Q4_1, &[0, 2]),
    (GgmlType::Q5_0, &[0]),
    (GgmlType::Q5_1, &[0, 2]),
    (GgmlType::Q8_0, &[0]),
    (GgmlType::Q2_K, &[80, 82]),
    (GgmlType::Q3_K, &[108]),
    (GgmlType::Q4_K, &[0, 2]),
    (GgmlType::Q5_K, &[0, 2]),
    (GgmlType::Q6_K, &[208]),
    (GgmlType::F16, &[]),
    (GgmlType::BF16, &[]),
    (GgmlType::F32, &[]),
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// `n_out` rows of `k` random valid elements of type `t`: random quant bytes, small finite scales.
fn random_weights(t: GgmlType, f16_fields: &[usize], n_out: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let (bs, ts) = t.block_geometry();
    let n_blocks = n_out * k / bs;
    let mut w = vec![0u8; n_blocks * ts];
    match t {
        GgmlType::F32 => w.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&rng.unit().to_le_bytes())),
        GgmlType::F16 => w.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&blocks::f32_to_f16_bits(rng.unit()).to_le_bytes())),
        GgmlType::BF16 => w.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&blocks::f32_to_bf16_bits(rng.unit()).to_le_bytes())),
        _ => {
            w.iter_mut().for_each(|b| *b = rng.next() as u8);
            for blk in w.chunks_exact_mut(ts) {
                for &off in f16_fields {
                    let v = rng.unit() * 0.01;
                    blk[off..off + 2].copy_from_slice(&blocks::f32_to_f16_bits(v).to_le_bytes());
                }
            }
        }
    }
    w
}

fn random_x(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * 2.0).collect()
}

fn run(level: SimdLevel, t: GgmlType, w: &[u8], n_out: usize, k: usize, x: &[f32], n_rows: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n_rows * n_out];
    matmul_at(level, t, w, n_out, k, x, n_rows, &mut y).unwrap();
    y
}

/// Each SIMD level against the scalar oracle: |y − y_scalar| ≤ 1e-5 · Σ|terms| bound per output,
/// where the bound uses the scalar result's magnitude and the row's dynamic range.
fn check_levels(t: GgmlType, f16_fields: &[usize], n_out: usize, k: usize, n_rows: usize, seed: u64) {
    let mut rng = Rng(seed);
    let w = random_weights(t, f16_fields, n_out, k, &mut rng);
    let x = random_x(n_rows * k, &mut rng);
    let reference = run(SimdLevel::Scalar, t, &w, n_out, k, &x, n_rows);
    assert!(reference.iter().all(|v| v.is_finite()), "{t:?}: scalar produced a non-finite value");
    let scale = reference.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
    for level in available_levels() {
        let got = run(level, t, &w, n_out, k, &x, n_rows);
        for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
            let tol = 2e-5 * scale + 1e-5 * r.abs();
            assert!(
                (g - r).abs() <= tol,
                "{t:?} {level:?} n_out={n_out} k={k} n_rows={n_rows}: y[{i}] = {g}, scalar {r} (tol {tol})"
            );
        }
    }
}

#[test]
fn every_format_every_level_matches_scalar() {
    for (i, &(t, f)) in FORMATS.iter().enumerate() {
        let bs = t.block_size().max(32);
        for (j, &(n_out, kb, n_rows)) in [(1, 1, 1), (7, 2, 1), (37, 4, 2), (64, 3, 3), (13, 1, 7), (50, 2, 64)].iter().enumerate() {
            check_levels(t, f, n_out, kb * bs.max(256), n_rows, (i * 100 + j) as u64);
        }
    }
}

#[test]
fn small_block_formats_at_k_not_multiple_of_256() {
    for &(t, f) in FORMATS.iter().filter(|(t, _)| t.block_size() <= 32) {
        check_levels(t, f, 19, 96, 5, 7);
        check_levels(t, f, 5, 32, 2, 8);
    }
}

#[test]
fn matches_scalar_at_a_real_shape() {
    for &(t, f) in FORMATS {
        check_levels(t, f, 96, 1536, 1, 42);
        check_levels(t, f, 40, 1536, 9, 43);
    }
}

#[test]
fn zero_activations_give_zero() {
    for &(t, f) in FORMATS {
        let mut rng = Rng(9);
        let w = random_weights(t, f, 8, 256, &mut rng);
        for level in available_levels() {
            let y = run(level, t, &w, 8, 256, &vec![0.0; 2 * 256], 2);
            assert!(y.iter().all(|v| *v == 0.0), "{t:?} {level:?}: {y:?}");
        }
    }
}

#[test]
fn argument_errors_are_typed() {
    let w = vec![0u8; 144 * 2];
    let x = vec![0.0f32; 256];
    let mut y = vec![0.0f32; 2];
    assert!(matches!(matmul(GgmlType::Q4_K, &w, 2, 256, &x, 1, &mut y), Ok(())));
    let bad_k = matmul(GgmlType::Q4_K, &w, 2, 200, &x[..200], 1, &mut y);
    assert!(matches!(bad_k, Err(FakError::InvalidArgument { .. })), "{bad_k:?}");
    let bad_w = matmul(GgmlType::Q4_K, &w[..100], 2, 256, &x, 1, &mut y);
    assert!(matches!(bad_w, Err(FakError::InvalidArgument { .. })));
    let bad_x = matmul(GgmlType::Q4_K, &w, 2, 256, &x[..255], 1, &mut y);
    assert!(matches!(bad_x, Err(FakError::InvalidArgument { .. })));
    let bad_y = matmul(GgmlType::Q4_K, &w, 2, 256, &x, 1, &mut y[..1]);
    assert!(matches!(bad_y, Err(FakError::InvalidArgument { .. })));
    let unsupported = matmul(GgmlType::IQ2_XXS, &[0u8; 66], 1, 256, &x, 1, &mut y[..1]);
    assert!(matches!(unsupported, Err(FakError::Unsupported(_))));
    let overflow = matmul(GgmlType::F32, &[], usize::MAX / 2, 4, &x[..4], 1, &mut y);
    assert!(matches!(overflow, Err(FakError::InvalidArgument { .. })));
}

#[test]
fn scalar_q8_0_matches_f64_on_exact_values() {
    // Q8_0 weights with d = 1 and activations that quantize exactly (amax = 127, integers):
    // the product is an exact integer.
    let k = 64;
    let mut w = Vec::new();
    for b in 0..2 {
        w.extend_from_slice(&blocks::f32_to_f16_bits(1.0).to_le_bytes());
        w.extend((0..32).map(|i| ((i as i32 - 16 + b) as i8) as u8));
    }
    let x: Vec<f32> = (0..k).map(|i| if i % 32 == 0 { 127.0 } else { (i % 7) as f32 - 3.0 }).collect();
    let expect: f64 = (0..k).map(|i| ((i % 32) as f64 - 16.0 + (i / 32) as f64) * x[i] as f64).sum();
    for level in available_levels() {
        let y = run(level, GgmlType::Q8_0, &w, 1, k, &x, 1);
        assert_eq!(y[0] as f64, expect, "{level:?}");
    }
}

#[test]
fn simd_level_name_is_known() {
    assert!(["scalar", "avx2", "avx512"].contains(&simd_level()));
    assert!(available_levels().contains(&SimdLevel::Scalar));
}

#[test]
fn simd_quantizers_are_bit_exact() {
    let mut rng = Rng(77);
    let mut x: Vec<f32> = (0..4096).map(|i| rng.unit() * (1 + i % 13) as f32).collect();
    x[..256].fill(0.0); // an all-zero block
    x[300] = 40.0; // largest element positive: Q8_K maps it to -127
    x[700] = -40.0;
    x[1000] = 3.0; // ties: +3 and -3 of equal magnitude, the first wins
    x[1001] = -3.0;
    for (i, v) in x[2048..2080].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5; // exact halves after scaling: round half to even
    }
    let q = Quantizers::at(detected_level());
    let s = Quantizers::at(SimdLevel::Scalar);
    let (mut a, mut b) = (vec![BlockQ8_0::default(); 128], vec![BlockQ8_0::default(); 128]);
    (q.q8_0)(&x, &mut a);
    (s.q8_0)(&x, &mut b);
    for (u, v) in a.iter().zip(&b) {
        assert_eq!((u.d.to_bits(), u.sum, u.qs), (v.d.to_bits(), v.sum, v.qs));
    }
    let (mut a, mut b) = (vec![BlockQ8_1::default(); 128], vec![BlockQ8_1::default(); 128]);
    (q.q8_1)(&x, &mut a);
    (s.q8_1)(&x, &mut b);
    for (u, v) in a.iter().zip(&b) {
        assert_eq!((u.d.to_bits(), u.s.to_bits(), u.qs), (v.d.to_bits(), v.s.to_bits(), v.qs));
    }
    let (mut a, mut b) = (vec![BlockQ8K::default(); 16], vec![BlockQ8K::default(); 16]);
    (q.q8_k)(&x, &mut a);
    (s.q8_k)(&x, &mut b);
    for (u, v) in a.iter().zip(&b) {
        assert_eq!((u.d.to_bits(), u.qs, u.bsums), (v.d.to_bits(), v.qs, v.bsums));
    }
    for f in [(q.f16, s.f16), (q.bf16, s.bf16)] {
        let (mut a, mut b) = (vec![0.0f32; x.len() - 3], vec![0.0f32; x.len() - 3]);
        (f.0)(&x[3..], &mut a);
        (f.1)(&x[3..], &mut b);
        assert!(a.iter().zip(&b).all(|(u, v)| u.to_bits() == v.to_bits()));
    }
}

#[test]
fn tiling_covers_and_balances() {
    // Decode: whole activation rows, chunks of >= 16 KiB of weights.
    let t = tiling(1536, 864, 1, 2);
    assert_eq!(t.row_block, 1);
    assert!(t.out_chunk * 864 >= 16 * 1024 && t.out_chunk % 4 == 0);
    // Prefill of a small n_out: the activation rows are split so both threads get work.
    let t = tiling(128, 616, 512, 2);
    assert!(128usize.div_ceil(t.out_chunk) * 512usize.div_ceil(t.row_block) >= 4, "{t:?}");
    assert_eq!(t.row_block % MAX_ROWS, 0);
    // Degenerate shapes stay valid.
    for (n_out, n_rows) in [(1, 1), (1, 1000), (3, 9), (100_000, 1)] {
        let t = tiling(n_out, 100, n_rows, 4);
        assert!(t.out_chunk >= 1 && t.out_chunk <= n_out && t.row_block >= 1, "{n_out} {n_rows} {t:?}");
    }
}

#[test]
fn small_n_out_prefill_split_over_rows_matches_scalar() {
    for &(t, f) in FORMATS.iter().filter(|(t, _)| matches!(t, GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::F16)) {
        check_levels(t, f, 6, 512, 100, 11);
    }
}

#[test]
fn float_formats_at_odd_k() {
    for &(t, f) in FORMATS.iter().filter(|(t, _)| t.block_size() == 1) {
        for (n_out, k, n_rows) in [(9, 37, 5), (4, 7, 1), (6, 23, 9)] {
            check_levels(t, f, n_out, k, n_rows, 5);
        }
    }
}

#[test]
fn non_finite_activations_do_not_panic() {
    for &(t, f) in FORMATS {
        let mut rng = Rng(3);
        let w = random_weights(t, f, 4, 256, &mut rng);
        let mut x = random_x(2 * 256, &mut rng);
        x[5] = f32::NAN;
        x[300] = f32::INFINITY;
        for level in available_levels() {
            let mut y = vec![0.0f32; 8];
            matmul_at(level, t, &w, 4, 256, &x, 2, &mut y).unwrap();
        }
    }
}

/// Formats whose SIMD kernels keep each row's f32 arithmetic independent of how many activation
/// rows share the call (the engine batches sequences and must not change a sequence's logits).
/// Q4_1 / Q5_1 (in no target model) are not.
const ROW_INVARIANT: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

#[test]
fn k_quant_rows_do_not_depend_on_the_batch() {
    for &(t, f) in FORMATS.iter().filter(|(t, _)| ROW_INVARIANT.contains(t)) {
        // Every kernel's tail: a partial group of 8 blocks (23 of 32 elements), leftover float
        // elements after the 8-element steps; rows 0..16 cover two 8-row prefill tiles and a rest.
        let k = match t.block_size() {
            1 => 757, // 94 8-element steps and 5 left over
            32 => 736,
            _ => 768,
        };
        let n_out = 12;
        let mut rng = Rng(21);
        let w = random_weights(t, f, n_out, k, &mut rng);
        let x = random_x(17 * k, &mut rng);
        for level in available_levels() {
            let single: Vec<Vec<f32>> = (0..17).map(|r| run(level, t, &w, n_out, k, &x[r * k..(r + 1) * k], 1)).collect();
            for n_rows in 2..=17 {
                let y = run(level, t, &w, n_out, k, &x[..n_rows * k], n_rows);
                for r in 0..n_rows {
                    let got: Vec<u32> = y[r * n_out..(r + 1) * n_out].iter().map(|v| v.to_bits()).collect();
                    let want: Vec<u32> = single[r].iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{t:?} {level:?}: row {r} of {n_rows} differs from the same row alone");
                }
            }
        }
    }
}

/// Weights at the largest quant magnitudes and scales, activations at ±127 after quantization:
/// the lanes the SIMD kernels pack to i16 reach their bound (4·63·127 for Q6_K) and must not
/// saturate. Compared with the scalar kernel (exact integer sums) at a tight relative bound.
#[test]
fn extreme_quants_do_not_saturate() {
    let k = 512;
    for &(t, f) in FORMATS.iter().filter(|(t, _)| t.block_size() > 1) {
        let (_, ts) = t.block_geometry();
        let mut w = vec![0xFFu8; 2 * k / t.block_size() * ts];
        for blk in w.chunks_exact_mut(ts) {
            for &off in f {
                blk[off..off + 2].copy_from_slice(&blocks::f32_to_f16_bits(0.01).to_le_bytes());
            }
            if t == GgmlType::Q6_K {
                // Signed scales at their largest magnitude.
                blk[blocks::q6_k::SCALES..blocks::q6_k::SCALES + 16].fill(0x80);
            }
        }
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..2 * k).map(|i| if i < k { sign } else { -sign * (1.0 + (i % 3) as f32) }).collect();
            let want = run(SimdLevel::Scalar, t, &w, 2, k, &x, 2);
            for level in available_levels() {
                let got = run(level, t, &w, 2, k, &x, 2);
                for (g, r) in got.iter().zip(&want) {
                    assert!((g - r).abs() <= 1e-5 * r.abs() + 1e-6, "{t:?} {level:?}: {g} vs scalar {r}");
                }
            }
        }
    }
}

/// Q4_0 / Q5_0 / Q8_0 on x86: the AVX2 and AVX-512 levels give bit-identical results (both take
/// ggml's f32 order, which the parity tests check against llama.cpp) for a decode over whole and
/// partial groups of weight rows (the 4-row lockstep GEMV and the one-row kernel) and for a
/// prefill over interleaved groups of 8 rows (the 512-bit kernel) with a tail; and a row's result
/// does not depend on the batch (prefill row = the same row decoded alone).
#[test]
fn q0_levels_bit_identical_and_batch_invariant() {
    let levels = available_levels();
    if !levels.contains(&SimdLevel::Avx2) {
        return;
    }
    let mut rng = Rng(7);
    for t in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
        for (n_out, k, n_rows) in [(9, 896, 1), (64, 1536, 1), (13, 896, 17), (64, 256, 8)] {
            let w = random_weights(t, &[0], n_out, k, &mut rng);
            let x = random_x(n_rows * k, &mut rng);
            let base = run(SimdLevel::Avx2, t, &w, n_out, k, &x, n_rows);
            for &level in &levels {
                if level < SimdLevel::Avx2 {
                    continue;
                }
                let got = run(level, t, &w, n_out, k, &x, n_rows);
                assert!(got.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()), "{t:?} {level:?} {n_out}x{k} rows {n_rows}");
                for r in [0, n_rows - 1] {
                    let alone = run(level, t, &w, n_out, k, &x[r * k..(r + 1) * k], 1);
                    let row = &got[r * n_out..(r + 1) * n_out];
                    assert!(alone.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()), "{t:?} {level:?} row {r} of {n_rows}");
                }
            }
        }
    }
}

/// The register-tiled Q4_K / Q6_K prefill (`tiled`: AVX-512 and AVX2) against the one-row kernels
/// it replaces (and the AVX-512 ones against the AVX2 ones): bit-identical outputs for row counts around its tile (4 rows) and panel (16 weight
/// rows) sizes, at the real models' Q4_K/Q6_K shapes (Qwen2.5-Coder 1.5B: 1536/256/8960 × 1536,
/// 1536 × 8960; 0.5B: 896 × 4864) and odd `n_out` (masked panel tails), for plain `matmul` rows
/// (Q4_K's GEMV order; Q6_K's `ggml_vec_dot` order, which stays on the one-row kernel),
/// llama.cpp's ubatch pattern (Q4_K: the first `n − n mod 4` rows in the 4-row GEMM order; Q6_K:
/// the tiled-kernel order from 8 rows) and a random mix of the orders (Q6_K: some rows through the
/// fallback inside the tiled driver). The one-row kernels are the ones the parity tests check
/// against llama.cpp.
#[test]
fn tiled_bit_identical() {
    let levels: Vec<SimdLevel> = available_levels().into_iter().filter(|&l| l >= SimdLevel::Avx2).collect();
    if levels.is_empty() {
        return;
    }
    let mut rng = Rng(16);
    let counts: &[usize] = &[1, 2, 3, 4, 7, 8, 9, 16, 17, 33, 512];
    let shapes: &[(usize, usize, &[usize])] = &[
        (256, 1536, counts),
        (1536, 1536, &[16, 33, 512]),
        (8960, 1536, &[17, 33]),
        (1536, 8960, &[16, 33]),
        (896, 4864, &[16, 33]),
        (37, 512, counts),
        (5, 256, &[16, 19, 40]),
    ];
    for (t, f16_fields) in [(GgmlType::Q4_K, &[0usize, 2][..]), (GgmlType::Q6_K, &[208][..])] {
        for &(n_out, k, counts) in shapes {
            let w = random_weights(t, f16_fields, n_out, k, &mut rng);
            for &n in counts {
                let x = random_x(n * k, &mut rng);
                let ubatch: Vec<LlamaRow> = (0..n).map(|r| LlamaRow { gemm4: r < n - n % 4, tiled: n >= 8, single: n == 1 }).collect();
                let mixed: Vec<LlamaRow> = (0..n).map(|_| LlamaRow { gemm4: !rng.next().is_multiple_of(3), tiled: !rng.next().is_multiple_of(3), single: false }).collect();
                for rows in [None, Some(&ubatch[..]), Some(&mixed[..])] {
                    let go = |level: SimdLevel, tiled: bool| {
                        let mut y = vec![f32::NAN; n * n_out];
                        matmul_impl(level, t, &w, n_out, k, &x, n, &mut y, rows, tiled).unwrap();
                        y
                    };
                    let want = go(levels[0], false);
                    assert!(want.iter().all(|v| v.is_finite()), "{t:?} {n_out}x{k} rows {n}: non-finite reference");
                    for &level in &levels {
                        for tiled in [false, true] {
                            let got = go(level, tiled);
                            let bad = want.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
                            assert!(bad.is_none(), "{t:?} {level:?} tiled {tiled} {n_out}x{k} rows {n} ({:?}): first differing output {bad:?}: {:?} vs {:?}", rows.map(|r| r[0]), bad.map(|i| want[i]), bad.map(|i| got[i]));
                        }
                    }
                }
            }
        }
    }
}

/// [`matmul_q8k`] on [`quantize_q8k`]'s blocks (the MoE experts' path: each row quantized once,
/// its blocks gathered per expert with the row's [`LlamaRow`]) gives [`matmul_rows`]' bits, for
/// row counts around the tiled kernels' thresholds, on the level in use.
#[test]
fn q8k_activations_match_matmul_rows() {
    let mut rng = Rng(27);
    for (t, f16_fields) in [(GgmlType::Q4_K, &[0usize, 2][..]), (GgmlType::Q5_K, &[0, 2][..]), (GgmlType::Q6_K, &[208][..])] {
        let (n_out, k) = (37, 512);
        let w = random_weights(t, f16_fields, n_out, k, &mut rng);
        for n in [1, 5, 8, 17, 40] {
            let x = random_x(n * k, &mut rng);
            let rows: Vec<LlamaRow> = (0..n).map(|_| LlamaRow { gemm4: rng.next().is_multiple_of(2), tiled: rng.next().is_multiple_of(2), single: true }).collect();
            let mut want = vec![f32::NAN; n * n_out];
            matmul_rows(t, &w, n_out, k, &x, n, &mut want, &rows).unwrap();
            let mut a = quantize_q8k(&x, k).unwrap();
            for (blocks, &kind) in a.chunks_mut(k / 256).zip(&rows) {
                blocks.iter_mut().for_each(|b| b.row = kind);
            }
            let mut got = vec![f32::NAN; n * n_out];
            matmul_q8k(t, &w, n_out, k, &a, n, &mut got).unwrap();
            assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{t:?} rows {n}");
        }
    }
    let mut y = vec![0f32; 4];
    assert!(matches!(matmul_q8k(GgmlType::Q8_0, &[0; 34 * 4], 4, 32, &[], 1, &mut y), Err(FakError::Unsupported(_))));
    assert!(quantize_q8k(&[0.0; 100], 100).is_err());
}
