//! Dequantizer tests: each format's block function against a per-element reference written
//! straight from the layout formula in the format's module docs (element index -> bits -> value),
//! on random blocks; plus the dispatcher's length checks and its parallel path.
//! Bit-exactness against ggml / the `gguf` package is tested in tests/test_quant_dequant.py.

use super::*;
use half::f16;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// A finite f16 (random bits with the exponent kept below all-ones).
    fn f16(&mut self) -> [u8; 2] {
        let mut b = self.next() as u16;
        if (b >> 10) & 0x1f == 0x1f {
            b &= 0xbfff;
        }
        b.to_le_bytes()
    }
}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Element `e` of one block of `t`, from the layout formula.
fn reference(t: GgmlType, b: &[u8], e: usize) -> f32 {
    use GgmlType::*;
    let nib = |byte: u8, high: bool| if high { byte >> 4 } else { byte & 0x0f };
    match t {
        Q4_0 => ((nib(b[2 + e % 16], e >= 16) as i32 - 8) as f32) * h(b, 0),
        Q4_1 => nib(b[4 + e % 16], e >= 16) as f32 * h(b, 0) + h(b, 2),
        Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let q = nib(b[6 + e % 16], e >= 16) as u32 | (((qh >> e) & 1) << 4);
            (q as i32 - 16) as f32 * h(b, 0)
        }
        Q5_1 => {
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            let q = nib(b[8 + e % 16], e >= 16) as u32 | (((qh >> e) & 1) << 4);
            q as f32 * h(b, 0) + h(b, 2)
        }
        Q8_0 => b[2 + e] as i8 as f32 * h(b, 0),
        Q2_K => {
            let (hh, k, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = (b[16 + 32 * hh + l] >> (2 * k)) & 3;
            let sc = b[8 * hh + 2 * k + l / 16];
            (h(b, 80) * (sc & 15) as f32) * q as f32 - h(b, 82) * (sc >> 4) as f32
        }
        Q3_K => {
            // scales through ggml's u32 kmask shuffle, independent of `q3_k::unpack_scales`
            let w = |i: usize| {
                u32::from_le_bytes([b[96 + 4 * i], b[97 + 4 * i], b[98 + 4 * i], b[99 + 4 * i]])
            };
            let (a0, a1, tmp) = (w(0), w(1), w(2));
            let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
            let aux = [
                (a0 & k2) | ((tmp & k1) << 4),
                (a1 & k2) | (((tmp >> 2) & k1) << 4),
                ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
                ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
            ];
            let (hh, k, l) = (e / 128, (e % 128) / 32, e % 32);
            let s = 8 * hh + 2 * k + l / 16;
            let sc = (aux[s / 4] >> (8 * (s % 4))) as u8 as i8 as i32 - 32;
            let low = ((b[32 + 32 * hh + l] >> (2 * k)) & 3) as i32;
            let q = low
                - if b[l] & (1 << (4 * hh + k)) != 0 {
                    0
                } else {
                    4
                };
            (h(b, 108) * sc as f32) * q as f32
        }
        Q4_K | Q5_K => {
            let s = &b[4..16];
            let (p, hi, l) = (e / 64, (e % 64) >= 32, e % 32);
            let j = 2 * p + hi as usize;
            // the gguf package's formulation: d = s[0..4], m = s[4..8], m_d = s[8..12]
            let (sc, m) = if j < 4 {
                (s[j] & 0x3f, s[j + 4] & 0x3f)
            } else {
                (
                    (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30),
                    (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30),
                )
            };
            let q = if t == Q4_K {
                nib(b[16 + 32 * p + l], hi)
            } else {
                nib(b[48 + 32 * p + l], hi) | (((b[16 + l] >> j) & 1) << 4)
            };
            (h(b, 0) * sc as f32) * q as f32 - h(b, 2) * m as f32
        }
        Q6_K => {
            let (hh, r) = (e / 128, e % 128);
            let (quarter, l) = (r / 32, r % 32);
            let low = nib(b[64 * hh + l + 32 * (quarter & 1)], quarter >= 2);
            let high = (b[128 + 32 * hh + l] >> (2 * quarter)) & 3;
            let q = (low | (high << 4)) as i32 - 32;
            let sc = b[192 + 8 * hh + l / 16 + 2 * quarter] as i8;
            (h(b, 208) * sc as f32) * q as f32
        }
        F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => h(b, 0),
        BF16 => f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16),
        _ => unreachable!("no reference for {t:?}"),
    }
}

/// f16 scale fields of each block format (byte offsets).
fn f16_fields(t: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match t {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

const SUPPORTED: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn random_blocks(t: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let (_, ts) = t.block_geometry();
    let mut v = rng.bytes(n * ts);
    for blk in v.chunks_exact_mut(ts) {
        for &at in f16_fields(t) {
            blk[at..at + 2].copy_from_slice(&rng.f16());
        }
        if t == GgmlType::F16 {
            blk.copy_from_slice(&rng.f16());
        }
    }
    v
}

#[test]
fn every_format_matches_its_layout_formula() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for t in SUPPORTED {
        let (bs, ts) = t.block_geometry();
        let n = 64;
        let src = random_blocks(t, n, &mut rng);
        let mut dst = vec![0f32; n * bs];
        dequantize(t, &src, &mut dst).unwrap();
        for (i, y) in dst.iter().enumerate() {
            let want = reference(t, &src[(i / bs) * ts..(i / bs + 1) * ts], i % bs);
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "{t:?} element {i}: {y} != {want}"
            );
        }
    }
}

#[test]
fn parallel_path_equals_serial_path() {
    let mut rng = Rng(42);
    for t in SUPPORTED {
        let (bs, _) = t.block_geometry();
        let n = (PARALLEL_MIN_ELEMS * 3 + 7 * bs) / bs; // several rayon tasks and a ragged last one
        let src = random_blocks(t, n, &mut rng);
        let (mut a, mut b) = (vec![0f32; n * bs], vec![1f32; n * bs]);
        dequantize(t, &src, &mut a).unwrap();
        dequantize_row(t, &src, &mut b).unwrap();
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{t:?}"
        );
    }
}

#[test]
fn q3_k_scale_unpacking_matches_kmask_shuffle() {
    let mut rng = Rng(3);
    for _ in 0..1000 {
        let mut blk = rng.bytes(110);
        blk[108..110].copy_from_slice(&f16::ONE.to_le_bytes());
        let mut sc = [0u8; 12];
        sc.copy_from_slice(&blk[96..108]);
        let scales = q3_k::unpack_scales(&sc);
        // with every quant forced to 1 (low bits 01, high bit set), y = scale - 32
        blk[..32].fill(0xff);
        blk[32..96].fill(0x55);
        let mut y = [0f32; 256];
        q3_k::dequantize_block(blk.as_slice().try_into().unwrap(), &mut y);
        for (e, v) in y.iter().enumerate() {
            let s = 8 * (e / 128) + 2 * ((e % 128) / 32) + (e % 32) / 16;
            assert_eq!(*v, scales[s] as f32 - 32.0);
        }
    }
}

#[test]
fn lengths_are_checked_and_unsupported_types_named() {
    let mut dst = vec![0f32; 32];
    assert!(matches!(
        dequantize(GgmlType::Q4_0, &[0u8; 17], &mut dst),
        Err(FakError::InvalidArgument { .. })
    ));
    assert!(matches!(
        dequantize(GgmlType::Q4_0, &[0u8; 36], &mut dst),
        Err(FakError::InvalidArgument { .. })
    ));
    assert!(matches!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 34], &mut dst[..31]),
        Err(FakError::InvalidArgument { .. })
    ));
    let e = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut vec![0f32; 256]).unwrap_err();
    assert!(
        matches!(e, FakError::Unsupported(ref m) if m.contains("IQ2_XXS")),
        "{e}"
    );
    assert!(dequantize(GgmlType::Q4_K, &[], &mut []).is_ok());
    assert!(SUPPORTED.iter().all(|&t| can_dequantize(t)));
    assert!(!can_dequantize(GgmlType::Q8_K));
}

#[test]
fn get_scale_min_k4_examples() {
    // j < 4: low 6 bits of q[j] and q[j + 4]
    let q = [0xc1, 0, 0, 0, 0x85, 0, 0, 0, 0x3a, 0, 0, 0];
    assert_eq!(q4_k::get_scale_min_k4(0, &q), (0x01, 0x05));
    // j = 4: scale = (q[8] & 0xF) | (q[0] >> 6) << 4 = 0xA | 0x30; min = (q[8] >> 4) | (q[4] >> 6) << 4 = 3 | 0x20
    assert_eq!(q4_k::get_scale_min_k4(4, &q), (0x3a, 0x23));
}
