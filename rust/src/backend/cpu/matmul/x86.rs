//! x86-64 SIMD kernels: one source (the `kernels!` macro) compiled twice, for AVX2+FMA+F16C and for
//! AVX-512 (VL/BW + VNNI). Both work on 256-bit vectors (Zen 4 splits 512-bit ops in two, so wider
//! vectors would not add throughput); the AVX-512 build gets 32 vector registers, VNNI's
//! `vpdpbusd` / `vpdpwssd` (one instruction where AVX2 needs `maddubs`+`madd`+`add`) and
//! mask-register bit expansion.
//!
//! The integer structure is ggml's x86 `ggml_vec_dot_*` (ggml-cpu `arch/x86/quants.c`): exact i32
//! sums per block (32-element formats) or per super-block with 6-bit sub-block scales (k-quants),
//! converted to f32 and scaled by `d_w·d_x` in 8 float lanes. The weight offsets (−8 for Q4_0,
//! −16 for Q5_0, −32 for Q6_K) are applied exactly in integers through the activation sums
//! (`Σq`, `bsums`) instead of per element.
//!
//! Each kernel handles `R` ≤ 4 (8 with AVX-512) activation rows per weight row: the weight block is
//! unpacked once and dotted with every row (the prefill micro-tile); `R = 1` is the decode GEMV.
//! Q4_0/Q5_0/Q8_0 decode instead puts 8 weight rows in the lanes of one vector ([`q0_w8`]) and
//! their prefill 8 activation rows ([`q0_x8`]). Whatever the variant, an output's float arithmetic
//! depends only on its weight row and activation row (row invariance, see `super`).

#![allow(clippy::missing_safety_doc, clippy::too_many_arguments, clippy::needless_range_loop)]

use super::Plan;
use crate::quant::GgmlType;

/// ISA-specific integer dot helpers for the AVX2 build.
macro_rules! helpers_avx2 {
    () => {
        /// Lanes of 4-element sums `Σ u·s` (`u` unsigned bytes ≤ 127, `s` signed bytes) added to `acc`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn dot_us(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
        }
        /// `acc + Σ_pairs (u·s pair sums) · sc16`: the pair sums (i16, no saturation for `u` ≤ 63)
        /// weighted by the i16 sub-block scales in `sc16`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn dot_us_scaled(acc: __m256i, u: __m256i, s: __m256i, sc16: __m256i) -> __m256i {
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc16))
        }
        /// `acc + madd(a16, b16)`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
        }
        /// Expands 32 bits into 32 bytes: 0xFF where the bit is set (ggml `bytes_from_bits_32`).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn bits_to_bytes(bits: u32) -> __m256i {
            let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
            let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
            let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
            _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
        }
    };
}

/// ISA-specific integer dot helpers for the AVX-512 VNNI build.
macro_rules! helpers_avx512 {
    () => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn dot_us(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(acc, u, s)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn dot_us_scaled(acc: __m256i, u: __m256i, s: __m256i, sc16: __m256i) -> __m256i {
            _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), sc16)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            _mm256_dpwssd_epi32(acc, a, b)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn bits_to_bytes(bits: u32) -> __m256i {
            _mm256_movm_epi8(bits)
        }
    };
}

/// A [`Kernel`] entry point for a one-weight-row kernel `$f::<R, ..>`: walks the `nw` weight rows
/// and dispatches on the row count, to every count up to 8 where the level has 32 vector registers
/// (`wide`), else up to 4 and 5..8 as 4 + rest.
macro_rules! entry {
    ($wide:tt, $name:ident, $a:ty, $f:ident $(, $c:expr)*) => {
        pub(in super::super) unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const $a, st: usize, nb: usize, nr: usize, out: *mut f32) {
            debug_assert!((1..=MAX_ROWS).contains(&nr) && (1..=MAX_W).contains(&nw));
            for j in 0..nw {
                let (w, out) = (w.add(j * w_stride), out.add(j * MAX_ROWS));
                entry!(@dispatch $wide, w, a, st, nb, nr, out, $f $(, $c)*)
            }
        }
    };
    (@dispatch true, $w:ident, $a:ident, $st:ident, $nb:ident, $nr:ident, $out:ident, $f:ident $(, $c:expr)*) => {
        match $nr {
            1 => $f::<1 $(, $c)*>($w, $a, $st, $nb, $out),
            2 => $f::<2 $(, $c)*>($w, $a, $st, $nb, $out),
            3 => $f::<3 $(, $c)*>($w, $a, $st, $nb, $out),
            4 => $f::<4 $(, $c)*>($w, $a, $st, $nb, $out),
            5 => $f::<5 $(, $c)*>($w, $a, $st, $nb, $out),
            6 => $f::<6 $(, $c)*>($w, $a, $st, $nb, $out),
            7 => $f::<7 $(, $c)*>($w, $a, $st, $nb, $out),
            _ => $f::<8 $(, $c)*>($w, $a, $st, $nb, $out),
        }
    };
    (@dispatch false, $w:ident, $a:ident, $st:ident, $nb:ident, $nr:ident, $out:ident, $f:ident $(, $c:expr)*) => {{
        match $nr.min(4) {
            1 => $f::<1 $(, $c)*>($w, $a, $st, $nb, $out),
            2 => $f::<2 $(, $c)*>($w, $a, $st, $nb, $out),
            3 => $f::<3 $(, $c)*>($w, $a, $st, $nb, $out),
            _ => $f::<4 $(, $c)*>($w, $a, $st, $nb, $out),
        }
        if $nr > 4 {
            let (a2, out2) = ($a.add(4 * $st), $out.add(4));
            match $nr - 4 {
                1 => $f::<1 $(, $c)*>($w, a2, $st, $nb, out2),
                2 => $f::<2 $(, $c)*>($w, a2, $st, $nb, out2),
                3 => $f::<3 $(, $c)*>($w, a2, $st, $nb, out2),
                _ => $f::<4 $(, $c)*>($w, a2, $st, $nb, out2),
            }
        }
    }};
}

/// A [`Kernel`] entry point for a float kernel blocked over `NW` weight rows × `R` activation
/// rows (`float::<NW, R, KIND>`): up to `$maxw` weight rows per call and 4 activation rows (float
/// activations take 4 bytes per element; more rows would not stay in L1), two accumulators each.
macro_rules! float_entry {
    ($maxw:tt, $name:ident, $kind:expr) => {
        pub(in super::super) unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const f32, st: usize, n: usize, nr: usize, out: *mut f32) {
            debug_assert!((1..=MAX_ROWS).contains(&nr) && (1..=MAX_W).contains(&nw));
            if nr == 1 {
                // Decode: one row at a time with two accumulator chains (a pure weight stream).
                for j in 0..nw {
                    *out.add(j * MAX_ROWS) = float_gemv::<$kind>(w.add(j * w_stride), a, n);
                }
                return;
            }
            let mut j = 0;
            while j < nw {
                let jw = (nw - j).min($maxw);
                let (wj, oj) = (w.add(j * w_stride), out.add(j * MAX_ROWS));
                let mut r = 0;
                while r < nr {
                    let rr = (nr - r).min(4);
                    let (ar, or) = (a.add(r * st), oj.add(r));
                    float_entry!(@w jw, rr, wj, w_stride, ar, st, n, or, $kind);
                    r += rr;
                }
                j += jw;
            }
        }
    };
    (@w $jw:ident, $rr:ident, $w:ident, $ws:ident, $a:ident, $st:ident, $n:ident, $o:ident, $kind:expr) => {
        match $jw {
            1 => float_entry!(@r 1, $rr, $w, $ws, $a, $st, $n, $o, $kind),
            2 => float_entry!(@r 2, $rr, $w, $ws, $a, $st, $n, $o, $kind),
            3 => float_entry!(@r 3, $rr, $w, $ws, $a, $st, $n, $o, $kind),
            _ => float_entry!(@r 4, $rr, $w, $ws, $a, $st, $n, $o, $kind),
        }
    };
    (@r $nw:literal, $rr:ident, $w:ident, $ws:ident, $a:ident, $st:ident, $n:ident, $o:ident, $kind:expr) => {
        match $rr {
            1 => float::<$nw, 1, $kind>($w, $ws, $a, $st, $n, $o),
            2 => float::<$nw, 2, $kind>($w, $ws, $a, $st, $n, $o),
            3 => float::<$nw, 3, $kind>($w, $ws, $a, $st, $n, $o),
            _ => float::<$nw, 4, $kind>($w, $ws, $a, $st, $n, $o),
        }
    };
}

/// Byte-shuffle patterns that broadcast i16 lane `j` (bytes 2j, 2j+1) of a 128-bit half.
static BCAST16: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut j = 0;
    while j < 8 {
        let mut b = 0;
        while b < 32 {
            t[j][b] = (2 * j + b % 2) as u8;
            b += 1;
        }
        j += 1;
    }
    t
};

/// Byte-shuffle patterns selecting bytes (2p, 2p+1) as [2p ×8, 2p+1 ×8] (Q6_K scale pairs).
static PAIR8: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut p = 0;
    while p < 8 {
        let mut b = 0;
        while b < 16 {
            t[p][b] = (2 * p + b / 8) as u8;
            b += 1;
        }
        p += 1;
    }
    t
};

macro_rules! kernels {
    ($feat:literal, $helpers:ident, $wide:tt, $maxw:tt) => {
        use core::arch::x86_64::*;
        use super::super::blocks;
        use super::super::act::{BlockQ8K, BlockQ8_0, BlockQ8_0x8, BlockQ8_1};
        use super::super::{MAX_ROWS, MAX_W};

        $helpers!();

        /// f16 bits → f32 with F16C.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn f16(p: *const u8) -> f32 {
            let h = (p as *const u16).read_unaligned();
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
        }

        /// Sum of the 8 float lanes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn load(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p as *const __m256i)
        }

        /// 32 4-bit values of a 16-byte block as bytes: low nibbles then high nibbles.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn nibbles32(p: *const u8) -> __m256i {
            let t = _mm_loadu_si128(p as *const __m128i);
            let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
            _mm256_and_si256(both, _mm256_set1_epi8(0xF))
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn store<const R: usize>(acc: &[__m256; R], extra: &[f32; R], out: *mut f32) {
            for r in 0..R {
                *out.add(r) = hsum(acc[r]) + extra[r];
            }
        }

        // ------------------------------------------------------------ 32-element block formats

        /// One Q4_1 / Q5_1 block `i` · Q8_1 for `R` rows: `d_w·d_x·Σ u·q8` into `acc`, `m·s` into `summs`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn blk_q4_1_q5_1<const R: usize, const Q5: bool>(b: *const u8, a: *const BlockQ8_1, st: usize, i: usize, acc: &mut [__m256; R], summs: &mut [f32; R]) {
            let qs_off = if Q5 { blocks::q5_1::QS } else { blocks::q4_1::QS };
            let dw = f16(b);
            let m = f16(b.add(2));
            let mut u = nibbles32(b.add(qs_off));
            if Q5 {
                let qh = (b.add(blocks::q5_1::QH) as *const u32).read_unaligned();
                u = _mm256_or_si256(u, _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
            }
            for r in 0..R {
                let y = &*a.add(r * st + i);
                summs[r] += m * y.s;
                let dot = dot_us(_mm256_setzero_si256(), u, load(y.qs.as_ptr() as *const u8));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), _mm256_cvtepi32_ps(dot), acc[r]);
            }
        }

        /// Q4_1 / Q5_1 (`Q5`) weights · Q8_1.
        #[target_feature(enable = $feat)]
        unsafe fn q4_1_q5_1<const R: usize, const Q5: bool>(w: *const u8, a: *const BlockQ8_1, st: usize, nb: usize, out: *mut f32) {
            let bytes = if Q5 { blocks::q5_1::BYTES } else { blocks::q4_1::BYTES };
            let mut acc0 = [_mm256_setzero_ps(); R];
            let mut acc1 = [_mm256_setzero_ps(); R];
            let mut summs = [0.0f32; R];
            let mut i = 0;
            while i + 2 <= nb {
                blk_q4_1_q5_1::<R, Q5>(w.add(i * bytes), a, st, i, &mut acc0, &mut summs);
                blk_q4_1_q5_1::<R, Q5>(w.add((i + 1) * bytes), a, st, i + 1, &mut acc1, &mut summs);
                i += 2;
            }
            if i < nb {
                blk_q4_1_q5_1::<R, Q5>(w.add(i * bytes), a, st, i, &mut acc0, &mut summs);
            }
            for r in 0..R {
                acc0[r] = _mm256_add_ps(acc0[r], acc1[r]);
            }
            store(&acc0, &summs, out);
        }

        /// Sums of each of 8 i32 vectors, as the 8 lanes of one vector (exact; a hadd tree).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn reduce8(v: [__m256i; 8]) -> __m256i {
            let h01 = _mm256_hadd_epi32(v[0], v[1]);
            let h23 = _mm256_hadd_epi32(v[2], v[3]);
            let h45 = _mm256_hadd_epi32(v[4], v[5]);
            let h67 = _mm256_hadd_epi32(v[6], v[7]);
            let h0123 = _mm256_hadd_epi32(h01, h23);
            let h4567 = _mm256_hadd_epi32(h45, h67);
            _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(h0123, h4567), _mm256_permute2x128_si256::<0x31>(h0123, h4567))
        }

        /// Q4_0 / Q5_0 / Q8_0 (`KIND` 0/1/2) weights · one interleaved group of 8 Q8_0 rows: the
        /// 8 per-row integer block sums land in the 8 lanes of one vector, scaled by the vector of
        /// the rows' `d` in one FMA (instead of one convert + FMA per row and block).
        ///
        /// The arithmetic of every (weight row, activation row) pair, shared with [`q0_w8`]:
        /// `acc = 0; acc = fma(d_w·d_x, (exact i32 block dot) as f32, acc)` block after block.
        #[target_feature(enable = $feat)]
        unsafe fn q0_x8<const KIND: u8>(w: *const u8, a: *const BlockQ8_0x8, nb: usize, out: *mut f32) {
            let bytes = match KIND { 0 => blocks::q4_0::BYTES, 1 => blocks::q5_0::BYTES, _ => blocks::q8_0::BYTES };
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let b = w.add(i * bytes);
                let y = &*a.add(i);
                let dw = _mm256_set1_ps(f16(b));
                let mut v = [_mm256_setzero_si256(); 8];
                if KIND == 2 {
                    let q = load(b.add(blocks::q8_0::QS));
                    let aq = _mm256_sign_epi8(q, q);
                    for r in 0..8 {
                        let sx = _mm256_sign_epi8(load(y.qs[r].as_ptr() as *const u8), q);
                        v[r] = dot_us(_mm256_setzero_si256(), aq, sx);
                    }
                } else {
                    let mut u = nibbles32(b.add(if KIND == 1 { blocks::q5_0::QS } else { blocks::q4_0::QS }));
                    if KIND == 1 {
                        let qh = (b.add(blocks::q5_0::QH) as *const u32).read_unaligned();
                        u = _mm256_or_si256(u, _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
                    }
                    for r in 0..8 {
                        v[r] = dot_us(_mm256_setzero_si256(), u, load(y.qs[r].as_ptr() as *const u8));
                    }
                }
                let mut s = reduce8(v);
                if KIND != 2 {
                    // Σ(u − off)·q = Σu·q − off·Σq, off = 8 (Q4_0) or 16 (Q5_0).
                    let sums = _mm256_load_si256(y.sum.as_ptr() as *const __m256i);
                    let off = if KIND == 1 { _mm256_slli_epi32(sums, 4) } else { _mm256_slli_epi32(sums, 3) };
                    s = _mm256_sub_epi32(s, off);
                }
                let d = _mm256_mul_ps(dw, _mm256_load_ps(y.d.as_ptr()));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
            }
            _mm256_storeu_ps(out, acc);
        }

        macro_rules! x8_entry {
            ($name:ident, $kind:expr) => {
                pub(in super::super) unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const BlockQ8_0x8, nb: usize, out: *mut f32) {
                    debug_assert!((1..=MAX_W).contains(&nw));
                    for j in 0..nw {
                        q0_x8::<$kind>(w.add(j * w_stride), a, nb, out.add(j * MAX_ROWS));
                    }
                }
            };
        }
        x8_entry!(k_q4_0_x8, 0);
        x8_entry!(k_q5_0_x8, 1);
        x8_entry!(k_q8_0_x8, 2);

        /// Q4_0 / Q5_0 / Q8_0 (`KIND` 0/1/2) weights · ONE Q8_0 activation row, up to 8 weight
        /// rows in the 8 lanes (the decode GEMV): per block the weight rows' integer dots are
        /// reduced into one vector and scaled in one FMA, with exactly [`q0_x8`]'s arithmetic per
        /// (weight row, activation row) pair, so a row gets the same bits alone or in a group.
        /// Writes `out[j·MAX_ROWS]` for `j < nw`.
        #[target_feature(enable = $feat)]
        unsafe fn q0_w8<const KIND: u8>(w: *const u8, w_stride: usize, nw: usize, a: *const BlockQ8_0, nb: usize, out: *mut f32) {
            debug_assert!((1..=8).contains(&nw));
            let bytes = match KIND { 0 => blocks::q4_0::BYTES, 1 => blocks::q5_0::BYTES, _ => blocks::q8_0::BYTES };
            let mut acc = _mm256_setzero_ps();
            let mut dh = [0u16; 8];
            for i in 0..nb {
                let y = &*a.add(i);
                let yq = load(y.qs.as_ptr() as *const u8);
                let mut v = [_mm256_setzero_si256(); 8];
                for j in 0..8 {
                    if j >= nw {
                        break;
                    }
                    let b = w.add(j * w_stride + i * bytes);
                    dh[j] = (b as *const u16).read_unaligned();
                    v[j] = if KIND == 2 {
                        let q = load(b.add(blocks::q8_0::QS));
                        dot_us(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(yq, q))
                    } else {
                        let mut u = nibbles32(b.add(if KIND == 1 { blocks::q5_0::QS } else { blocks::q4_0::QS }));
                        if KIND == 1 {
                            let qh = (b.add(blocks::q5_0::QH) as *const u32).read_unaligned();
                            u = _mm256_or_si256(u, _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
                        }
                        dot_us(_mm256_setzero_si256(), u, yq)
                    };
                }
                let mut s = reduce8(v);
                if KIND != 2 {
                    // Σ(u − off)·q = Σu·q − off·Σq, as q0_x8 (lanes j ≥ nw are discarded).
                    let off = y.sum.wrapping_mul(if KIND == 1 { 16 } else { 8 });
                    s = _mm256_sub_epi32(s, _mm256_set1_epi32(off));
                }
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i));
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(y.d));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
            }
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            for j in 0..nw {
                *out.add(j * MAX_ROWS) = lanes[j];
            }
        }

        macro_rules! w8_entry {
            ($name:ident, $kind:expr) => {
                /// A [`Kernel`](super::super::Kernel): [`q0_w8`] for each activation row.
                pub(in super::super) unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const BlockQ8_0, st: usize, nb: usize, nr: usize, out: *mut f32) {
                    debug_assert!((1..=MAX_ROWS).contains(&nr) && (1..=MAX_W).contains(&nw));
                    for r in 0..nr {
                        let mut j = 0;
                        while j < nw {
                            let jw = (nw - j).min(8);
                            q0_w8::<$kind>(w.add(j * w_stride), w_stride, jw, a.add(r * st), nb, out.add(j * MAX_ROWS + r));
                            j += jw;
                        }
                    }
                }
            };
        }
        w8_entry!(k_q4_0, 0);
        w8_entry!(k_q5_0, 1);
        w8_entry!(k_q8_0, 2);

        // ------------------------------------------------------------ k-quants

        /// The 8 scales (`sc`) and 8 mins (`mn`) of a Q4_K/Q5_K block as bytes (ggml's utmp trick).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn k4_scales(p: *const u8) -> (u64, u64) {
            const KMASK1: u32 = 0x3f3f3f3f;
            const KMASK2: u32 = 0x0f0f0f0f;
            const KMASK3: u32 = 0x03030303;
            let u0 = (p as *const u32).read_unaligned();
            let u1 = (p.add(4) as *const u32).read_unaligned();
            let u2 = (p.add(8) as *const u32).read_unaligned();
            let sc_lo = u0 & KMASK1;
            let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
            let mn_lo = u1 & KMASK1;
            let mn_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
            ((sc_lo as u64) | ((sc_hi as u64) << 32), (mn_lo as u64) | ((mn_hi as u64) << 32))
        }

        /// The 8 byte scales as i16 in both 128-bit halves, for [`bcast16`].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn scales16(scales: u64) -> __m256i {
            _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64)))
        }

        /// Scale `j` of [`scales16`] broadcast to every i16 lane (one byte shuffle).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn bcast16(s16: __m256i, j: usize) -> __m256i {
            _mm256_shuffle_epi8(s16, _mm256_loadu_si256(super::BCAST16[j].as_ptr() as *const __m256i))
        }

        /// Mins duplicated per pair of bsums: [m0, m0, m1, m1, ..., m7, m7] as i16.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn mins_pairs(mins: u64) -> __m256i {
            let m8 = _mm_cvtsi64_si128(mins as i64);
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8))
        }

        /// Q4_K / Q5_K (`Q5`) weights · Q8_K. For one or two rows the low- and high-nibble
        /// products go to separate integer accumulators (two dependency chains per row; exact, so
        /// the sums are the same). The float arithmetic of a row is the same for every `R`: the
        /// scaled sums and the mins go to two chains, added at the end (as llama.cpp's GEMV).
        #[target_feature(enable = $feat)]
        unsafe fn q4k_q5k<const R: usize, const Q5: bool>(w: *const u8, a: *const BlockQ8K, st: usize, nb: usize, out: *mut f32) {
            let bytes = if Q5 { blocks::q5_k::BYTES } else { blocks::q4_k::BYTES };
            let qs_off = if Q5 { blocks::q5_k::QS } else { blocks::q4_k::QS };
            let split = R <= 2;
            let m4 = _mm256_set1_epi8(0xF);
            let mut acc = [_mm256_setzero_ps(); R];
            let mut accm = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let b = w.add(i * bytes);
                let d = f16(b);
                let dmin = f16(b.add(2));
                let (sc, mn) = k4_scales(b.add(4));
                let s16 = scales16(sc);
                let hbits = if Q5 { load(b.add(blocks::q5_k::QH)) } else { _mm256_setzero_si256() };
                let mut sumi = [_mm256_setzero_si256(); R];
                let mut sumi2 = [_mm256_setzero_si256(); R];
                for j in 0..4 {
                    let q = load(b.add(qs_off + 32 * j));
                    let mut lo = _mm256_and_si256(q, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    if Q5 {
                        let bl = _mm256_set1_epi8(1 << (2 * j));
                        let bh = _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8);
                        let sixteen = _mm256_set1_epi8(0x10);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bl), bl), sixteen));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bh), bh), sixteen));
                    }
                    let s_lo = bcast16(s16, 2 * j);
                    let s_hi = bcast16(s16, 2 * j + 1);
                    for r in 0..R {
                        let y = (*a.add(r * st + i)).qs.as_ptr() as *const u8;
                        sumi[r] = dot_us_scaled(sumi[r], lo, load(y.add(64 * j)), s_lo);
                        if split {
                            sumi2[r] = dot_us_scaled(sumi2[r], hi, load(y.add(64 * j + 32)), s_hi);
                        } else {
                            sumi[r] = dot_us_scaled(sumi[r], hi, load(y.add(64 * j + 32)), s_hi);
                        }
                    }
                }
                let mp = mins_pairs(mn);
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    let msum = madd_acc(_mm256_setzero_si256(), load(y.bsums.as_ptr() as *const u8), mp);
                    let si = if split { _mm256_add_epi32(sumi[r], sumi2[r]) } else { sumi[r] };
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(si), acc[r]);
                    accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * y.d), _mm256_cvtepi32_ps(msum), accm[r]);
                }
            }
            for r in 0..R {
                acc[r] = _mm256_add_ps(acc[r], accm[r]);
            }
            store(&acc, &[0.0; R], out);
        }

        /// Q6_K weights · Q8_K: `Σ_sub sc·Σ u·q8 − 32·Σ_sub sc·bsum`, `u` = 6-bit unsigned.
        #[target_feature(enable = $feat)]
        unsafe fn q6k<const R: usize>(w: *const u8, a: *const BlockQ8K, st: usize, nb: usize, out: *mut f32) {
            use blocks::q6_k::*;
            let m4 = _mm256_set1_epi8(0xF);
            let m3 = _mm256_set1_epi8(0x30);
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let b = w.add(i * BYTES);
                let d = f16(b.add(D));
                let sc8 = _mm_loadu_si128(b.add(SCALES) as *const __m128i);
                // -32·sc as i16, to weight the 16 bsums: the exact −32 offset of every element.
                let sc16 = _mm256_cvtepi8_epi16(sc8);
                let off16 = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sc16), 5);
                let mut sumi = [_mm256_setzero_si256(); R];
                let mut sumi2 = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    sumi[r] = madd_acc(sumi[r], load(y.bsums.as_ptr() as *const u8), off16);
                }
                for n in 0..2 {
                    let ql0 = load(b.add(QL + 64 * n));
                    let ql1 = load(b.add(QL + 64 * n + 32));
                    let qh = load(b.add(QH + 32 * n));
                    for t in 0..4 {
                        // Quarter t of the half: low nibbles of ql0/ql1 (t = 0, 1) or high (2, 3),
                        // plus 2 bits of qh at 2t, as a 6-bit unsigned value; unpacked per quarter
                        // to keep few vectors live (AVX2 has 16 registers).
                        let l = if t % 2 == 0 { ql0 } else { ql1 };
                        let low = if t < 2 { _mm256_and_si256(l, m4) } else { _mm256_and_si256(_mm256_srli_epi16(l, 4), m4) };
                        let high = match t {
                            0 => _mm256_slli_epi16(qh, 4),
                            1 => _mm256_slli_epi16(qh, 2),
                            2 => qh,
                            _ => _mm256_srli_epi16(qh, 2),
                        };
                        let q = _mm256_or_si256(low, _mm256_and_si256(high, m3));
                        // Sub-blocks 8n+2t and 8n+2t+1: [sc_a ×8, sc_b ×8] as i16.
                        let pat = _mm_loadu_si128(super::PAIR8[4 * n + t].as_ptr() as *const __m128i);
                        let s16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pat));
                        for r in 0..R {
                            let y = (*a.add(r * st + i)).qs.as_ptr() as *const u8;
                            if R <= 2 && t % 2 == 1 {
                                sumi2[r] = dot_us_scaled(sumi2[r], q, load(y.add(128 * n + 32 * t)), s16);
                            } else {
                                sumi[r] = dot_us_scaled(sumi[r], q, load(y.add(128 * n + 32 * t)), s16);
                            }
                        }
                    }
                }
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    let si = _mm256_add_epi32(sumi[r], sumi2[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(si), acc[r]);
                }
            }
            store(&acc, &[0.0; R], out);
        }

        /// Q2_K weights · Q8_K: 2-bit values with 4-bit scales and mins per 16 elements.
        #[target_feature(enable = $feat)]
        unsafe fn q2k<const R: usize>(w: *const u8, a: *const BlockQ8K, st: usize, nb: usize, out: *mut f32) {
            use blocks::q2_k::*;
            let m3 = _mm256_set1_epi8(3);
            let m4 = _mm_set1_epi8(0xF);
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let b = w.add(i * BYTES);
                let d = f16(b.add(D));
                let dmin = f16(b.add(DMIN));
                let sc_raw = _mm_loadu_si128(b.add(SCALES) as *const __m128i);
                let sc8 = _mm_and_si128(sc_raw, m4);
                let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc_raw, 4), m4));
                let mut sumi = [_mm256_setzero_si256(); R];
                for n in 0..2 {
                    let q32 = load(b.add(QS + 32 * n));
                    for j in 0..4 {
                        let u = _mm256_and_si256(_mm256_srl_epi16(q32, _mm_cvtsi32_si128(2 * j as i32)), m3);
                        let pat = _mm_loadu_si128(super::PAIR8[4 * n + j].as_ptr() as *const __m128i);
                        let s16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sc8, pat));
                        for r in 0..R {
                            let y = (*a.add(r * st + i)).qs.as_ptr() as *const u8;
                            sumi[r] = dot_us_scaled(sumi[r], u, load(y.add(128 * n + 32 * j)), s16);
                        }
                    }
                }
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    let msum = madd_acc(_mm256_setzero_si256(), load(y.bsums.as_ptr() as *const u8), mins16);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * y.d), _mm256_cvtepi32_ps(msum), acc[r]);
                }
            }
            store(&acc, &[0.0; R], out);
        }

        /// Q3_K weights · Q8_K: `u = q + 4` (0..7, unsigned) in the products, the −4 offset
        /// applied exactly through `−4·Σ sc·bsum`.
        #[target_feature(enable = $feat)]
        unsafe fn q3k<const R: usize>(w: *const u8, a: *const BlockQ8K, st: usize, nb: usize, out: *mut f32) {
            use blocks::q3_k::*;
            let m3 = _mm256_set1_epi8(3);
            let four = _mm256_set1_epi8(4);
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let b = w.add(i * BYTES);
                let d = f16(b.add(D));
                let scales = blocks::q3k_scales(core::slice::from_raw_parts(b.add(SCALES), 12));
                let sc8 = _mm_loadu_si128(scales.as_ptr() as *const __m128i);
                let off16 = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(sc8)), 2);
                let hm = load(b.add(HMASK));
                let mut sumi = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    sumi[r] = madd_acc(sumi[r], load(y.bsums.as_ptr() as *const u8), off16);
                }
                for n in 0..2 {
                    let q32 = load(b.add(QS + 32 * n));
                    for j in 0..4 {
                        let lo = _mm256_and_si256(_mm256_srl_epi16(q32, _mm_cvtsi32_si128(2 * j as i32)), m3);
                        let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                        let h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                        let u = _mm256_or_si256(lo, h);
                        let pat = _mm_loadu_si128(super::PAIR8[4 * n + j].as_ptr() as *const __m128i);
                        let s16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pat));
                        for r in 0..R {
                            let y = (*a.add(r * st + i)).qs.as_ptr() as *const u8;
                            sumi[r] = dot_us_scaled(sumi[r], u, load(y.add(128 * n + 32 * j)), s16);
                        }
                    }
                }
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                }
            }
            store(&acc, &[0.0; R], out);
        }

        // ------------------------------------------------------------ float formats

        /// 8 weights of a float format (`KIND` 0 = f32, 1 = f16, 2 = bf16) as f32.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn load_wf<const KIND: u8>(p: *const u8) -> __m256 {
            match KIND {
                0 => _mm256_loadu_ps(p as *const f32),
                1 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                _ => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)), 16)),
            }
        }

        /// One F32 / F16 / BF16 weight row (`KIND` 0/1/2) · one f32 activation row, 16 elements per
        /// step into two accumulators (hides the FMA latency of a single output).
        #[target_feature(enable = $feat)]
        unsafe fn float_gemv<const KIND: u8>(w: *const u8, a: *const f32, n: usize) -> f32 {
            let esz = if KIND == 0 { 4 } else { 2 };
            let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n {
                acc0 = _mm256_fmadd_ps(load_wf::<KIND>(w.add(i * esz)), _mm256_loadu_ps(a.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(load_wf::<KIND>(w.add((i + 8) * esz)), _mm256_loadu_ps(a.add(i + 8)), acc1);
                i += 16;
            }
            let mut tail = 0.0f32;
            for t in i..n {
                let p = w.add(t * esz);
                let wv = match KIND {
                    0 => (p as *const f32).read_unaligned(),
                    1 => f16(p),
                    _ => blocks::bf16_bits_to_f32((p as *const u16).read_unaligned()),
                };
                tail += wv * *a.add(t);
            }
            hsum(_mm256_add_ps(acc0, acc1)) + tail
        }

        /// F32 / F16 / BF16 weights (`KIND` 0/1/2) · f32 activations (already rounded to the
        /// weight's type by the caller, as ggml converts them to `vec_dot_type`): an `NW × R`
        /// register tile, each weight vector and each activation vector loaded once per step.
        /// `out[j·MAX_ROWS + r]`. Each output is computed exactly as [`float_gemv`] computes it
        /// (two accumulators over 16-element steps, a scalar tail), so rows get the same bits in
        /// any tile.
        #[target_feature(enable = $feat)]
        unsafe fn float<const NW: usize, const R: usize, const KIND: u8>(w: *const u8, ws: usize, a: *const f32, st: usize, n: usize, out: *mut f32) {
            let esz = if KIND == 0 { 4 } else { 2 };
            let mut acc0 = [[_mm256_setzero_ps(); R]; NW];
            let mut acc1 = [[_mm256_setzero_ps(); R]; NW];
            let mut i = 0;
            while i + 16 <= n {
                let mut w0 = [_mm256_setzero_ps(); NW];
                let mut w1 = [_mm256_setzero_ps(); NW];
                for j in 0..NW {
                    w0[j] = load_wf::<KIND>(w.add(j * ws + i * esz));
                    w1[j] = load_wf::<KIND>(w.add(j * ws + (i + 8) * esz));
                }
                for r in 0..R {
                    let x0 = _mm256_loadu_ps(a.add(r * st + i));
                    let x1 = _mm256_loadu_ps(a.add(r * st + i + 8));
                    for j in 0..NW {
                        acc0[j][r] = _mm256_fmadd_ps(w0[j], x0, acc0[j][r]);
                        acc1[j][r] = _mm256_fmadd_ps(w1[j], x1, acc1[j][r]);
                    }
                }
                i += 16;
            }
            for j in 0..NW {
                let mut tail = [0.0f32; R];
                for t in i..n {
                    let p = w.add(j * ws + t * esz);
                    let wv = match KIND {
                        0 => (p as *const f32).read_unaligned(),
                        1 => f16(p),
                        _ => blocks::bf16_bits_to_f32((p as *const u16).read_unaligned()),
                    };
                    for r in 0..R {
                        tail[r] += wv * *a.add(r * st + t);
                    }
                }
                let mut sum = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    sum[r] = _mm256_add_ps(acc0[j][r], acc1[j][r]);
                }
                store(&sum, &tail, out.add(j * MAX_ROWS));
            }
        }

        // ------------------------------------------------------------ Kernel entry points

        entry!($wide, k_q4_1, BlockQ8_1, q4_1_q5_1, false);
        entry!($wide, k_q5_1, BlockQ8_1, q4_1_q5_1, true);
        entry!($wide, k_q4_k, BlockQ8K, q4k_q5k, false);
        entry!($wide, k_q5_k, BlockQ8K, q4k_q5k, true);
        entry!($wide, k_q6_k, BlockQ8K, q6k);
        entry!($wide, k_q2_k, BlockQ8K, q2k);
        entry!($wide, k_q3_k, BlockQ8K, q3k);
        float_entry!($maxw, k_f32, 0);
        float_entry!($maxw, k_f16, 1);
        float_entry!($maxw, k_bf16, 2);
    };
}

pub(super) mod avx2 {
    kernels!("avx2,fma,f16c", helpers_avx2, false, 1);
}

pub(super) mod avx512 {
    kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", helpers_avx512, true, 2);
}

/// The kernels of one x86 level for type `t`, or `None` where that level has none (the caller
/// falls back to a lower level).
pub(super) fn plan(t: GgmlType, avx512: bool) -> Option<Plan> {
    use GgmlType as G;
    macro_rules! pick {
        ($k:ident) => {
            if avx512 { avx512::$k } else { avx2::$k }
        };
    }
    Some(match t {
        G::Q4_0 => Plan::Q8_0(pick!(k_q4_0), Some(pick!(k_q4_0_x8))),
        G::Q5_0 => Plan::Q8_0(pick!(k_q5_0), Some(pick!(k_q5_0_x8))),
        G::Q8_0 => Plan::Q8_0(pick!(k_q8_0), Some(pick!(k_q8_0_x8))),
        G::Q4_1 => Plan::Q8_1(pick!(k_q4_1)),
        G::Q5_1 => Plan::Q8_1(pick!(k_q5_1)),
        G::Q4_K => Plan::Q8K(pick!(k_q4_k)),
        G::Q5_K => Plan::Q8K(pick!(k_q5_k)),
        G::Q6_K => Plan::Q8K(pick!(k_q6_k)),
        G::Q2_K => Plan::Q8K(pick!(k_q2_k)),
        G::Q3_K => Plan::Q8K(pick!(k_q3_k)),
        G::F32 => Plan::F32(pick!(k_f32)),
        G::F16 => Plan::F16(pick!(k_f16)),
        G::BF16 => Plan::BF16(pick!(k_bf16)),
        _ => return None,
    })
}

/// Activation quantizers with AVX2 (+F16C), bit-identical to the scalar ones in `act` (same
/// operations per element: one f32 multiply, round half to even, saturating packs; `max` is
/// order-independent). Used at both x86 levels.
pub(super) mod quant {
    use super::super::act::{BlockQ8K, BlockQ8_0, BlockQ8_1, QK8, QK_K};
    use core::arch::x86_64::*;

    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// f32 → nearest f16 → f32 (F16C, round half to even).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn round_f16(v: f32) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(v))))
    }

    /// 32 i32 lanes (4 vectors, in order) → 32 saturated i8 stored at `dst`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_store(r: [__m256i; 4], dst: *mut i8) {
        let a = _mm256_packs_epi32(r[0], r[1]);
        let b = _mm256_packs_epi32(r[2], r[3]);
        let p = _mm256_packs_epi16(a, b);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(dst as *mut __m256i, p);
    }

    /// One block of 32: (f16-rounded d, f32 d, Σq) with the quants stored to `qs`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_32(x: *const f32, qs: *mut i8) -> (f32, f32, i32) {
        let sign = _mm256_set1_ps(-0.0);
        let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
        let m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        let m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        let amax = hmax(_mm256_max_ps(m01, m23));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let mut r = [_mm256_setzero_si256(); 4];
        for (ri, vi) in r.iter_mut().zip(v) {
            // Clamped like the i8 packs below, so Σq matches the stored quants even for
            // non-finite input (finite input never reaches the bounds).
            let q = _mm256_cvtps_epi32(_mm256_round_ps::<RNE>(_mm256_mul_ps(vi, id)));
            *ri = _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-128));
        }
        let sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
        pack_store(r, qs);
        (round_f16(d), d, sum)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
        for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK8)) {
            let (dh, _, sum) = q8_32(xs.as_ptr(), b.qs.as_mut_ptr());
            b.d = dh;
            b.sum = sum;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
        for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK8)) {
            let (dh, d, sum) = q8_32(xs.as_ptr(), b.qs.as_mut_ptr());
            b.d = dh;
            b.s = round_f16(d * sum as f32);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
        let sign = _mm256_set1_ps(-0.0);
        for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
            let p = xs.as_ptr();
            let mut m = _mm256_setzero_ps();
            for j in 0..QK_K / 8 {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * j))));
            }
            let amax = hmax(m);
            if amax == 0.0 {
                *b = BlockQ8K::default();
                continue;
            }
            // The first element of largest magnitude (ggml keeps the first on ties), with its sign.
            let am = _mm256_set1_ps(amax);
            let mut max = 0.0f32;
            for j in 0..QK_K / 8 {
                let eq = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * j))), am));
                if eq != 0 {
                    max = xs[8 * j + eq.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0f32 / max;
            let is = _mm256_set1_ps(iscale);
            let c127 = _mm256_set1_epi32(127);
            for g in 0..QK_K / 32 {
                let mut r = [_mm256_setzero_si256(); 4];
                for (t, rt) in r.iter_mut().enumerate() {
                    let v = _mm256_loadu_ps(p.add(32 * g + 8 * t));
                    let q = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps::<RNE>(_mm256_mul_ps(v, is))), c127);
                    *rt = _mm256_max_epi32(q, _mm256_set1_epi32(-128));
                }
                b.bsums[2 * g] = hsum_i32(_mm256_add_epi32(r[0], r[1])) as i16;
                b.bsums[2 * g + 1] = hsum_i32(_mm256_add_epi32(r[2], r[3])) as i16;
                pack_store(r, b.qs.as_mut_ptr().add(32 * g));
            }
            b.d = 1.0 / iscale;
        }
    }

    /// x rounded to f16 (F16C, half to even), as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn row_f16(x: &[f32], out: &mut [f32]) {
        let n8 = x.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(_mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(v)));
        }
        for i in n8..x.len() {
            out[i] = round_f16(x[i]);
        }
    }

    /// x rounded to bf16 (ggml's rounding), as f32; the scalar loop vectorizes under AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn row_bf16(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = super::super::blocks::bf16_bits_to_f32(super::super::blocks::f32_to_bf16_bits(v));
        }
    }
}
