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
//! The k-quant kernels (Q4_K, Q5_K, Q6_K) take each sub-block's exact `Σ u·q8` from `vpdpbusd`
//! (lanes small enough to pack to i16 without saturation) and apply the integer sub-block scales
//! to two packed sub-blocks with one `vpdpwssd`: the fewest instructions per weight byte found for
//! a decode, where one activation row cannot amortize per-block work (measured against ggml's
//! `maddubs` + scale-broadcast structure: +14 % Q4_K, +33 % Q6_K GEMV from cache on Zen 4).
//!
//! Each kernel handles `R` ≤ 8 activation rows per weight row (≤ 4 per call on AVX2's 16
//! registers): the weight block is unpacked once and dotted with every row (the prefill
//! micro-tile); `R = 1` is the decode GEMV. For the k-quants a row's f32 operations do not depend
//! on `R`, so a sequence's result does not depend on the batch it is computed in.

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
        /// Whether Q8_0 weights are offset to unsigned (`q ^ 0x80`, needs a non-saturating u8·i8
        /// dot product): not with `maddubs`, whose i16 pair sums would overflow at 2·255·128.
        const Q8_OFFSET: bool = false;
        /// `u + 16` in the bytes whose bit is set in `bits` (Q5_0's 5th bit).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn add16_where(u: __m256i, bits: u32) -> __m256i {
            _mm256_or_si256(u, _mm256_and_si256(bits_to_bytes(bits), _mm256_set1_epi8(0x10)))
        }
        /// 32 4-bit values of a 16-byte block as bytes: low nibbles then high nibbles.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn nibbles32(p: *const u8) -> __m256i {
            let t = _mm_loadu_si128(p as *const __m128i);
            let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
            _mm256_and_si256(both, _mm256_set1_epi8(0xF))
        }
        /// `(x & m) | y` on 128 bits.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn or_and128(x: __m128i, m: __m128i, y: __m128i) -> __m128i {
            _mm_or_si128(_mm_and_si128(x, m), y)
        }
        /// Bitwise `m ? a : b` (AVX2: and / andnot / or).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn select(m: __m256i, a: __m256i, b: __m256i) -> __m256i {
            _mm256_or_si256(_mm256_and_si256(m, a), _mm256_andnot_si256(m, b))
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
        /// Whether Q8_0 weights are offset to unsigned (`q ^ 0x80`): `vpdpbusd` sums u8·i8 in i32.
        const Q8_OFFSET: bool = true;
        /// `u + 16` in the bytes whose bit is set in `bits`: one masked byte add.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn add16_where(u: __m256i, bits: u32) -> __m256i {
            _mm256_mask_add_epi8(u, bits, u, _mm256_set1_epi8(0x10))
        }
        /// 32 4-bit values of a 16-byte block as bytes: low nibbles then high nibbles (the 16 bytes
        /// in both halves, the upper half shifted by a per-lane count).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn nibbles32(p: *const u8) -> __m256i {
            let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
            let sh = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
            _mm256_and_si256(_mm256_srlv_epi16(t, sh), _mm256_set1_epi8(0xF))
        }
        /// `(x & m) | y` on 128 bits in one `vpternlogd`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn or_and128(x: __m128i, m: __m128i, y: __m128i) -> __m128i {
            _mm_ternarylogic_epi32::<0xEA>(x, m, y)
        }
        /// Bitwise `m ? a : b` in one `vpternlogd`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn select(m: __m256i, a: __m256i, b: __m256i) -> __m256i {
            _mm256_ternarylogic_epi32::<0xE4>(a, b, m)
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
/// rows (`float::<NW, R, KIND>`): up to `$maxw` weight rows and `$maxr` activation rows per call.
/// A decode (`nr = 1`) goes one weight row at a time: interleaving the streams of several rows
/// measured ~40 % slower from DRAM on Zen 4.
macro_rules! float_entry {
    ($maxw:tt, $maxr:tt, $name:ident, $kind:expr) => {
        pub(in super::super) unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const f32, st: usize, n: usize, nr: usize, out: *mut f32) {
            debug_assert!((1..=MAX_ROWS).contains(&nr) && (1..=MAX_W).contains(&nw));
            let maxw = if nr == 1 { 1 } else { $maxw };
            let mut j = 0;
            while j < nw {
                let jw = (nw - j).min(maxw);
                let (wj, oj) = (w.add(j * w_stride), out.add(j * MAX_ROWS));
                let mut r = 0;
                while r < nr {
                    let rr = (nr - r).min($maxr);
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

/// Byte-shuffle patterns over 8 i16 scales (the same 8 in both 128-bit halves) giving, per half,
/// [s_{2j} ×4, s_{2j+1} ×4]: the scales of a Q4_K sub-block pair after `packs_epi32`.
static PAIRS4: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 32 {
            let p = (b % 16) / 2;
            t[j][b] = (2 * (2 * j + p / 4) + b % 2) as u8;
            b += 1;
        }
        j += 1;
    }
    t
};

/// Byte-shuffle patterns over the 8 i16 scales of one Q6_K half (the same 8 in both 128-bit
/// halves) giving [s_{b} ×4, s_{b+2} ×4] in the low half and [s_{b+1} ×4, s_{b+3} ×4] in the high
/// half, `b` = 0 or 4: the scales of two packed 32-element quarters (16-element sub-blocks).
/// Byte shuffles picking sub-block scales `2c` (8 times) then `2c + 1` (8 times), `c < 8` (ggml
/// `get_scale_shuffle`).
static SCALE_PAIRS: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut c = 0;
    while c < 8 {
        let mut j = 0;
        while j < 16 {
            t[c][j] = (2 * c + j / 8) as u8;
            j += 1;
        }
        c += 1;
    }
    t
};

/// Bytes ahead of the weight block being read that the GEMV loops prefetch (`prefetcht0`). The
/// weights stream from DRAM once per token, and on an Intel Xeon (KVM guest) the hardware
/// prefetchers alone left the Q5_0/Q8_0 GEMV latency-bound at 3 GB/s per core; with 2 KiB of
/// software prefetch it runs at 8–13 GB/s (Q4_K/Q6_K 8–10 → 12–13 GB/s). Measured 1024–8192:
/// flat from 2048.
const PREFETCH: usize = 2048;

macro_rules! kernels {
    ($feat:literal, $helpers:ident, $wide:tt, $maxw:tt, $maxr:tt) => {
        use core::arch::x86_64::*;
        use super::super::blocks;
        use super::super::act::{BlockQ8K, BlockQ8_0x8, BlockQ8_1};
        use super::super::{MAX_ROWS, MAX_W};

        $helpers!();

        /// f16 bits → f32 with F16C.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn f16(p: *const u8) -> f32 {
            let h = (p as *const u16).read_unaligned() as u32;
            // `vmovd` zeroes the upper lanes. LLVM's own lowering of `_mm_cvtsi32_si128` here is
            // a `vpinsrw` into whatever register it picks — in the GEMV loops an accumulator —
            // which chains every block's scale conversion behind the previous block's FMA
            // (≈ 18 cycles per Q5_0/Q8_0 block measured on Intel Xeon, 4× slower than the loads).
            let v: __m128;
            core::arch::asm!("vmovd {v}, {h:e}", "vcvtph2ps {v}, {v}", h = in(reg) h, v = out(xmm_reg) v,
                             options(pure, nomem, nostack, preserves_flags));
            _mm_cvtss_f32(v)
        }

        /// Sum of the 8 float lanes.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn hsum(v: __m256) -> f32 {
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

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn store<const R: usize>(acc: &[__m256; R], extra: &[f32; R], out: *mut f32) {
            for r in 0..R {
                *out.add(r) = hsum(acc[r]) + extra[r];
            }
        }

        // ------------------------------------------------------------ 32-element block formats

        /// One Q4_0 / Q5_0 / Q8_0 (`KIND` 0/1/2) weight block as 32 bytes: the unsigned 4- or
        /// 5-bit values (before their −8 / −16 offset), or Q8_0's `q` (`q ^ 0x80` where [`Q8_OFFSET`]).
        #[inline]
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn q0_unpack<const KIND: u8>(b: *const u8) -> __m256i {
            match KIND {
                0 => nibbles32(b.add(blocks::q4_0::QS)),
                1 => add16_where(nibbles32(b.add(blocks::q5_0::QS)), (b.add(blocks::q5_0::QH) as *const u32).read_unaligned()),
                _ if Q8_OFFSET => _mm256_xor_si256(load(b.add(blocks::q8_0::QS)), _mm256_set1_epi8(0x80u8 as i8)),
                _ => load(b.add(blocks::q8_0::QS)),
            }
        }

        /// Bytes per block of `KIND`.
        pub(super) const fn q0_bytes<const KIND: u8>() -> usize {
            match KIND {
                0 => blocks::q4_0::BYTES,
                1 => blocks::q5_0::BYTES,
                _ => blocks::q8_0::BYTES,
            }
        }

        /// One Q4_0 / Q5_0 / Q8_0 (`KIND` 0/1/2) weight block as 32 signed bytes (the weight values
        /// `q − 8`, `q − 16`, `q`), element order.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn q0_signed<const KIND: u8>(b: *const u8) -> __m256i {
            match KIND {
                0 => _mm256_sub_epi8(nibbles32(b.add(blocks::q4_0::QS)), _mm256_set1_epi8(8)),
                1 => _mm256_sub_epi8(q0_unpack::<1>(b), _mm256_set1_epi8(16)),
                _ => load(b.add(blocks::q8_0::QS)),
            }
        }

        /// `acc + (d_w·d_x) · lanes(w·y)`: ggml's per-block step of `ggml_vec_dot_q*_0_q8_0` (AVX2)
        /// and of llamafile's `tinyBLAS_Q0_AVX`: the 8 exact i32 sums of 4 consecutive products
        /// (`w` signed weights, `y` the activation quants) converted to f32 and fused-multiply-added
        /// with the broadcast product of the two block scales.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn q0_step(acc: __m256, aw: __m256i, w: __m256i, y: *const i8, d: f32) -> __m256 {
            let y = load(y as *const u8);
            let s = dot_us(_mm256_setzero_si256(), aw, _mm256_sign_epi8(y, w));
            _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc)
        }

        /// Q4_0 / Q5_0 / Q8_0 (`KIND` 0/1/2) weights · Q8_0 activations of `R` rows, each row's blocks
        /// grouped by 8 ([`BlockQ8_0x8`], `st` groups per row). The f32 arithmetic is ggml's (x86
        /// `ggml_vec_dot_q8_0_q8_0` / `_q5_0_` / `_q4_0_` and llamafile `tinyBLAS_Q0_AVX`, which
        /// llama.cpp runs for decode and prefill): one 8-lane accumulator per row, blocks in order
        /// ([`q0_step`]), reduced by [`hsum`] — bit-identical to llama.cpp, and a row's result does
        /// not depend on the batch.
        #[target_feature(enable = $feat)]
        unsafe fn q0_rows<const R: usize, const KIND: u8>(w: *const u8, a: *const BlockQ8_0x8, st: usize, nb: usize, out: *mut f32) {
            let bytes = q0_bytes::<KIND>();
            let mut acc = [_mm256_setzero_ps(); R];
            let pfd = super::PREFETCH;
            for i in 0..nb {
                let b = w.add(i * bytes);
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(pfd) as *const i8);
                let wv = q0_signed::<KIND>(b);
                let aw = _mm256_sign_epi8(wv, wv);
                let dw = f16(b);
                let (g, k) = (i / 8, i % 8);
                for r in 0..R {
                    let y = &*a.add(r * st + g);
                    acc[r] = q0_step(acc[r], aw, wv, y.qs[k].as_ptr(), dw * y.d[k]);
                }
            }
            store(&acc, &[0.0; R], out);
        }

        /// [`q0_rows`] for one activation row (the decode GEMV) and [`MAX_W`] weight rows in
        /// lockstep: each weight row keeps its own accumulator and takes exactly [`q0_rows`]'s f32
        /// operations, so results are bit-identical to it. One row alone is a chain of one FMA per
        /// 32-element block (4 cycles each), longer than the out-of-order window can overlap with
        /// the next row's; four independent chains keep the vector ports busy.
        #[target_feature(enable = $feat)]
        unsafe fn q0_gemv4<const KIND: u8>(w: *const u8, ws: usize, a: *const BlockQ8_0x8, nb: usize, out: *mut f32) {
            let bytes = q0_bytes::<KIND>();
            let mut acc = [_mm256_setzero_ps(); MAX_W];
            for i in 0..nb {
                let y = &*a.add(i / 8);
                let (yq, yd) = (y.qs[i % 8].as_ptr(), y.d[i % 8]);
                for j in 0..MAX_W {
                    let b = w.add(j * ws + i * bytes);
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(super::PREFETCH) as *const i8);
                    let wv = q0_signed::<KIND>(b);
                    let aw = _mm256_sign_epi8(wv, wv);
                    acc[j] = q0_step(acc[j], aw, wv, yq, f16(b) * yd);
                }
            }
            for j in 0..MAX_W {
                store(&[acc[j]], &[0.0], out.add(j * MAX_ROWS));
            }
        }

        /// The [`Kernel`] entry of a Q4_0 / Q5_0 / Q8_0 (`KIND`) weight type: [`q0_gemv4`] for a
        /// Q4_0/Q5_0 decode over a full group of weight rows, else [`q0_rows`] per weight row.
        /// Q8_0 stays on [`q0_rows`]: with fewer operations per byte it is bound by the weight
        /// stream, and four interleaved streams measured slower (11.4 → 14.7 ms per 0.5B token's
        /// Q8_0 matmuls on Intel Xeon; Q5_0 22.9 → 19.8 ms, CPU time).
        macro_rules! q0_entry {
            ($name:ident, $kind:expr) => {
                pub(in super::super) unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const BlockQ8_0x8, st: usize, nb: usize, nr: usize, out: *mut f32) {
                    debug_assert!((1..=MAX_ROWS).contains(&nr) && (1..=MAX_W).contains(&nw));
                    if $kind != 2 && nr == 1 && nw == MAX_W {
                        return q0_gemv4::<$kind>(w, w_stride, a, nb, out);
                    }
                    for j in 0..nw {
                        let (w, out) = (w.add(j * w_stride), out.add(j * MAX_ROWS));
                        entry!(@dispatch $wide, w, a, st, nb, nr, out, q0_rows, $kind)
                    }
                }
            };
        }

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

        /// Q4_0 / Q5_0 / Q8_0 (`KIND` 0/1/2) weights · one interleaved group of 8 Q8_0 rows (the
        /// prefill micro-tile): each weight block is unpacked once and stepped into the 8 rows'
        /// accumulators ([`q0_step`]), the same f32 operations per row as [`q0_rows`].
        #[target_feature(enable = $feat)]
        unsafe fn q0_x8<const KIND: u8>(w: *const u8, a: *const BlockQ8_0x8, nb: usize, out: *mut f32) {
            let bytes = q0_bytes::<KIND>();
            let mut acc = [_mm256_setzero_ps(); 8];
            for i in 0..nb {
                let b = w.add(i * bytes);
                let y = &*a.add(i);
                let wv = q0_signed::<KIND>(b);
                let aw = _mm256_sign_epi8(wv, wv);
                let dw = f16(b);
                for r in 0..8 {
                    acc[r] = q0_step(acc[r], aw, wv, y.qs[r].as_ptr(), dw * y.d[r]);
                }
            }
            for r in 0..8 {
                *out.add(r) = hsum(acc[r]);
            }
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

        // ------------------------------------------------------------ k-quants

        /// The 8 scales and 8 mins of a Q4_K/Q5_K block as bytes `[sc0..sc7, m0..m7]` of one vector:
        /// ggml's `utmp` unpacking (`get_scale_min_k4`) on 4 dword lanes (reads 16 bytes at `p`: the
        /// 12 scale bytes and 4 more).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn k4_scales_vec(p: *const u8) -> __m128i {
            let v = _mm_loadu_si128(p as *const __m128i);
            // Lanes [u0, u2, u1, u2 >> 4] and [u0, u0 >> 2, u1, u1 >> 2] (u_i: dword i of the scales).
            let x = _mm_srlv_epi32(_mm_shuffle_epi32::<0b10_01_10_00>(v), _mm_setr_epi32(0, 0, 0, 4));
            let y = _mm_srlv_epi32(_mm_shuffle_epi32::<0b01_01_00_00>(v), _mm_setr_epi32(0, 2, 0, 2));
            let y = _mm_and_si128(y, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
            or_and128(x, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f), y)
        }

        /// Q4_K / Q5_K (`Q5`) weights · Q8_K, `R` activation rows. Each 32-element sub-block's
        /// exact `Σ u·q8` comes from `vpdpbusd` (`maddubs` + `madd` on AVX2) in 8 i32 lanes of
        /// ≤ 4·31·127, so two sub-blocks pack to i16 exactly (`vpackssdw`) and are weighted by their
        /// 6-bit scales in one `vpdpwssd`; the mins go through `Σ m·bsum`, as in ggml.
        ///
        /// Q4_K takes the f32 arithmetic of the kernels llama.cpp's x86 build runs for it (weights
        /// repacked to `block_q4_Kx8`, ggml-cpu `arch/x86/repack.cpp`): exact integer sums
        /// `isum = Σ sc·Σ u·q8` and `imin = Σ m·bsum` accumulated as `acc += isum·(d·d_x)`,
        /// `acc_min += imin·(dmin·d_x)` (FMAs), result `acc − acc_min`; per super-block for a
        /// GEMV row (`ggml_gemv_q4_K_8x8_q8_K`), per pair of sub-blocks for a row llama.cpp
        /// computes in its 4-row GEMM (`ggml_gemm_q4_K_8x8_q8_K`), which the activation row's
        /// [`LlamaRow`](super::act::LlamaRow) selects — bit-identical to llama.cpp. Q5_K keeps 8 lanes.
        /// Per row the f32 operations (and their order) do not depend on `R`, so a row's result is
        /// the same whatever the batch it is computed in.
        #[target_feature(enable = $feat)]
        unsafe fn q4k_q5k<const R: usize, const Q5: bool>(w: *const u8, a: *const BlockQ8K, st: usize, nb: usize, out: *mut f32) {
            let bytes = if Q5 { blocks::q5_k::BYTES } else { blocks::q4_k::BYTES };
            let qs_off = if Q5 { blocks::q5_k::QS } else { blocks::q4_k::QS };
            let m4 = _mm256_set1_epi8(0xF);
            let sixteen = _mm256_set1_epi8(0x10);
            let zero = _mm256_setzero_si256();
            // Byte shuffle of the 8 mins (bytes 8..16 of `k4_scales_vec`) into pairs [m0, m0, m1, m1, ...].
            let mdup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
            // Two integer chains per row where registers allow (integer sums: the split is exact).
            let split = R <= 2;
            let mut acc = [_mm256_setzero_ps(); R];
            // Q4_K: [Σ d·d_x·isum, Σ dmin·d_x·imin] per row (ggml's repacked Q4_K arithmetic).
            let mut acc4 = [_mm_setzero_ps(); R];
            let pfd = super::PREFETCH;
            for i in 0..nb {
                let b = w.add(i * bytes);
                for l in (0..bytes).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(pfd + l) as *const i8);
                }
                let sm = k4_scales_vec(b.add(4));
                let s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
                let hbits = if Q5 { load(b.add(blocks::q5_k::QH)) } else { zero };
                let mut sumi = [[zero; 2]; R];
                // Q4_K: each row's 4 pair-of-sub-block sums, kept apart (see `q4k_q5k`).
                let mut vj = [[zero; 4]; R];
                for j in 0..4 {
                    let q = load(b.add(qs_off + 32 * j));
                    let mut lo = _mm256_and_si256(q, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    if Q5 {
                        // The 5th bit of sub-blocks 2j and 2j+1: bits 2j and 2j+1 of each qh byte.
                        let bl = _mm256_set1_epi8(1 << (2 * j));
                        let bh = _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bl), bl), sixteen));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bh), bh), sixteen));
                    }
                    let sp = _mm256_shuffle_epi8(s16, load(super::PAIRS4[j].as_ptr()));
                    let c = if split { j % 2 } else { 0 };
                    for r in 0..R {
                        let y = (*a.add(r * st + i)).qs.as_ptr() as *const u8;
                        let pl = dot_us(zero, lo, load(y.add(64 * j)));
                        let ph = dot_us(zero, hi, load(y.add(64 * j + 32)));
                        if !Q5 {
                            vj[r][j] = madd_acc(zero, _mm256_packs_epi32(pl, ph), sp);
                        } else {
                            sumi[r][c] = madd_acc(sumi[r][c], _mm256_packs_epi32(pl, ph), sp);
                        }
                    }
                }
                // [d, dmin] as f32 in one conversion.
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()));
                let mp = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, mdup));
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    let dmy = _mm_mul_ps(dm, _mm_set1_ps(y.d));
                    let msum = madd_acc(zero, load(y.bsums.as_ptr() as *const u8), mp);
                    if Q5 {
                        let si = if split { _mm256_add_epi32(sumi[r][0], sumi[r][1]) } else { sumi[r][0] };
                        acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dmy), _mm256_cvtepi32_ps(si), acc[r]);
                        acc[r] = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dmy)), _mm256_cvtepi32_ps(msum), acc[r]);
                    } else if y.row.gemm4 {
                        // ggml_gemm_q4_K_8x8_q8_K: one FMA per pair of sub-blocks (64 elements).
                        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(vj[r][0], vj[r][1]), _mm256_hadd_epi32(vj[r][2], vj[r][3]));
                        let is4 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                        let mh = _mm256_permute4x64_epi64::<0b1000>(_mm256_hadd_epi32(msum, msum));
                        let ms4 = _mm256_castsi256_si128(mh);
                        let mut isv = [0i32; 4];
                        let mut msv = [0i32; 4];
                        _mm_storeu_si128(isv.as_mut_ptr() as *mut __m128i, is4);
                        _mm_storeu_si128(msv.as_mut_ptr() as *mut __m128i, ms4);
                        for j in 0..4 {
                            acc4[r] = _mm_fmadd_ps(_mm_setr_ps(isv[j] as f32, msv[j] as f32, 0.0, 0.0), dmy, acc4[r]);
                        }
                    } else {
                        // ggml_gemv_q4_K_8x8_q8_K: the super-block's exact totals [isum, imin]
                        // (lanes 0, 1), then one FMA each.
                        let si = _mm256_add_epi32(_mm256_add_epi32(vj[r][0], vj[r][1]), _mm256_add_epi32(vj[r][2], vj[r][3]));
                        let t = _mm256_hadd_epi32(si, msum);
                        let t = _mm256_hadd_epi32(t, t);
                        let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
                        acc4[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(t), dmy, acc4[r]);
                    }
                }
            }
            if Q5 {
                store(&acc, &[0.0; R], out);
            } else {
                for r in 0..R {
                    *out.add(r) = _mm_cvtss_f32(_mm_sub_ss(acc4[r], _mm_movehdup_ps(acc4[r])));
                }
            }
        }

        /// Q4_K weights · Q8_K, `R` activation rows, in the f32 arithmetic of
        /// `ggml_vec_dot_q4_K_q8_K` (ggml-cpu `arch/x86/quants.c`, AVX2 path, which the AVX-512
        /// build runs too): what llama.cpp's x86 build computes for a Q4_K matrix it does not
        /// repack (rows not a multiple of 8, e.g. the Gated DeltaNet `ssm_alpha`/`ssm_beta` of a
        /// model with 4 value heads). Per super-block the exact integer lanes `sumi` (8 lanes: lane
        /// `t` holds `Σ_j sc·Σ_{4 bytes} u·q8` of bytes `4t..4t+3` of each 32-byte chunk) take
        /// `acc = fma(d_x·d, float(sumi), acc)`, the mins' 4 lanes `Σ m·(bsum pair)` take
        /// `acc_m = fma(−d_x·dmin, float(prod), acc_m)`; the result is `hsum(acc) + hsum4(acc_m)`.
        /// A row of a ubatch of ≥ 8 rows ([`LlamaRow::tiled`](super::act::LlamaRow)) takes
        /// llama.cpp's tiled K-quant kernel instead (it serves unrepacked Q4_K too), as `q6k` does.
        #[target_feature(enable = $feat)]
        unsafe fn q4k_vecdot<const R: usize>(w: *const u8, a: *const BlockQ8K, st: usize, nb: usize, out: *mut f32) {
            let m4 = _mm256_set1_epi8(0xF);
            let zero = _mm256_setzero_si256();
            let mut acc = [_mm256_setzero_ps(); R];
            let mut acc_m = [_mm_setzero_ps(); R];
            let mut tiled = [0f32; R];
            for i in 0..nb {
                let b = w.add(i * blocks::q4_k::BYTES);
                let sm = k4_scales_vec(b.add(4));
                let mut sc = [0u8; 16];
                _mm_storeu_si128(sc.as_mut_ptr() as *mut __m128i, sm);
                let mins = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
                let (dw, dminw) = (f16(b), f16(b.add(2)));
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    let qy = y.qs.as_ptr() as *const u8;
                    let mut sumi = zero;
                    for j in 0..4 {
                        let q = load(b.add(blocks::q4_k::QS + 32 * j));
                        let lo = _mm256_and_si256(q, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                        let pl = dot_us(zero, lo, load(qy.add(64 * j)));
                        let ph = dot_us(zero, hi, load(qy.add(64 * j + 32)));
                        let sl = _mm256_mullo_epi32(pl, _mm256_set1_epi32(sc[2 * j] as i32));
                        let sh = _mm256_mullo_epi32(ph, _mm256_set1_epi32(sc[2 * j + 1] as i32));
                        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(sl, sh));
                    }
                    let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
                    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
                    let prod = _mm_madd_epi16(mins, q8s);
                    if y.row.tiled {
                        // ggml-cpu tiled/tiled-kernel.cpp: res = fnmadd(dmin, float(imin), d·float(isum)),
                        // out = fma(res, d_x, out), with the exact super-block totals.
                        let (mut si, mut pi) = ([0i32; 8], [0i32; 4]);
                        _mm256_storeu_si256(si.as_mut_ptr() as *mut __m256i, sumi);
                        _mm_storeu_si128(pi.as_mut_ptr() as *mut __m128i, prod);
                        let (isum, imin) = (si.iter().sum::<i32>(), pi.iter().sum::<i32>());
                        let res = (-dminw).mul_add(imin as f32, dw * isum as f32);
                        tiled[r] = res.mul_add(y.d, tiled[r]);
                        continue;
                    }
                    acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(-y.d * dminw), _mm_cvtepi32_ps(prod), acc_m[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y.d * dw), _mm256_cvtepi32_ps(sumi), acc[r]);
                }
            }
            for r in 0..R {
                if (*a.add(r * st)).row.tiled {
                    *out.add(r) = tiled[r];
                    continue;
                }
                let m = _mm_add_ps(acc_m[r], _mm_movehl_ps(acc_m[r], acc_m[r]));
                let m = _mm_add_ss(m, _mm_movehdup_ps(m));
                *out.add(r) = hsum(acc[r]) + _mm_cvtss_f32(m);
            }
        }

        /// Q6_K weights · Q8_K, `R` activation rows: the 6-bit values `u` assembled with one
        /// bit-select each (`vpternlogd` on AVX-512); per super-block ggml's integer lanes
        /// (`ggml_vec_dot_q6_K_q8_K`, x86 AVX2): each 32-element chunk's pair sums weighted by its
        /// two 16-element sub-block scales, the −32 offset exactly through `−32·Σ sc·bsum`, then
        /// one FMA with `d_x·d_w` into 8 f32 lanes and [`hsum`]; or, for a row llama.cpp computes
        /// in its tiled K-quant kernel ([`LlamaRow::tiled`](super::act::LlamaRow)), the exact
        /// super-block total `isum` accumulated as `out = fma(isum·d_w, d_x, out)` (ggml-cpu
        /// `tiled/tiled-kernel.cpp`) — bit-identical to llama.cpp. Per-row f32 order is
        /// independent of `R`.
        #[target_feature(enable = $feat)]
        unsafe fn q6k<const R: usize>(w: *const u8, a: *const BlockQ8K, st: usize, nb: usize, out: *mut f32) {
            use blocks::q6_k::*;
            let m4 = _mm256_set1_epi8(0xF);
            let m33 = _mm256_set1_epi8(0x33);
            let mcc = _mm256_set1_epi8(0xCCu8 as i8);
            let zero = _mm256_setzero_si256();
            let mut tiled = [0f32; R];
            let mut acc = [_mm256_setzero_ps(); R];
            let pfd = super::PREFETCH;
            for i in 0..nb {
                let b = w.add(i * BYTES);
                for l in (0..BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(pfd + l) as *const i8);
                }
                let sc8 = _mm_loadu_si128(b.add(SCALES) as *const __m128i);
                let sc16 = _mm256_cvtepi8_epi16(sc8);
                let off16 = _mm256_slli_epi16(_mm256_sub_epi16(zero, sc16), 5);
                // ggml's lanes: lane l of the i32 sum holds, for each 32-element chunk c, the 4
                // products 4l..4l+3 times the chunk's sub-block scale (2c for l < 4, 2c+1 for l ≥ 4),
                // minus 32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1]).
                let mut sumi = [zero; R];
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    sumi[r] = madd_acc(zero, load(y.bsums.as_ptr() as *const u8), off16);
                }
                for n in 0..2 {
                    let ql0 = load(b.add(QL + 64 * n));
                    let ql1 = load(b.add(QL + 64 * n + 32));
                    let qh = load(b.add(QH + 32 * n));
                    // qh bits (2t, 2t+1) of quarter t moved to bits 4, 5, with bits 6, 7 clear.
                    let qa = _mm256_and_si256(qh, m33);
                    let qb = _mm256_and_si256(qh, mcc);
                    let u = [
                        select(m4, ql0, _mm256_slli_epi16(qa, 4)),
                        select(m4, ql1, _mm256_slli_epi16(qb, 2)),
                        select(m4, _mm256_srli_epi16(ql0, 4), qa),
                        select(m4, _mm256_srli_epi16(ql1, 4), _mm256_srli_epi16(qb, 2)),
                    ];
                    for t in 0..4 {
                        let c = 4 * n + t;
                        let sp = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, _mm_loadu_si128(super::SCALE_PAIRS[c].as_ptr() as *const __m128i)));
                        for r in 0..R {
                            let y = (*a.add(r * st + i)).qs.as_ptr() as *const u8;
                            sumi[r] = dot_us_scaled(sumi[r], u[t], load(y.add(32 * c)), sp);
                        }
                    }
                }
                let d = f16(b.add(D));
                for r in 0..R {
                    let y = &*a.add(r * st + i);
                    if y.row.tiled {
                        // llama.cpp's tiled kernel: out = fma(isum·d_w, d_x, out) (GCC contracts
                        // its mul + add), isum the super-block's exact total.
                        let t = _mm256_hadd_epi32(sumi[r], sumi[r]);
                        let t = _mm256_hadd_epi32(t, t);
                        let isum = _mm_cvtsi128_si32(_mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t)));
                        tiled[r] = (isum as f32 * d).mul_add(y.d, tiled[r]);
                    } else {
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y.d * d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                    }
                }
            }
            store(&acc, &[0.0; R], out);
            for r in 0..R {
                if (*a.add(r * st)).row.tiled {
                    *out.add(r) = tiled[r];
                }
            }
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

        /// One float weight element (`KIND` 0/1/2: f32, f16, bf16) as f32.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn load_w1<const KIND: u8>(p: *const u8) -> f32 {
            match KIND {
                0 => (p as *const f32).read_unaligned(),
                1 => f16(p),
                _ => blocks::bf16_bits_to_f32((p as *const u16).read_unaligned()),
            }
        }

        /// F32 / F16 / BF16 weights (`KIND` 0/1/2) · f32 activations (already rounded to the
        /// weight's type by the caller, as ggml converts them to `vec_dot_type`): an `NW × R`
        /// register tile, each weight vector and each activation vector loaded once per step.
        /// `out[j·MAX_ROWS + r]`.
        ///
        /// Every (weight row, activation row) pair sums its 8-element steps at offsets `≡ 0` and
        /// `≡ 8 (mod 16)` in two separate accumulators (the second hides the FMA latency of a lone
        /// GEMV), adds them, reduces the 8 lanes ([`hsum`]) and adds the < 8 leftover products in
        /// order: the same f32 operations whatever `NW` and `R`. A single pair walks the row once
        /// with both accumulators (a weight stream from DRAM); a tile walks its (cache-resident)
        /// rows twice, one accumulator per pair per pass, to keep the tile in registers.
        #[target_feature(enable = $feat)]
        unsafe fn float<const NW: usize, const R: usize, const KIND: u8>(w: *const u8, ws: usize, a: *const f32, st: usize, n: usize, out: *mut f32) {
            let esz = if KIND == 0 { 4 } else { 2 };
            // 8-element steps at `first`, `first + 16`, ... below `end`, into `acc` (by value, so the
            // tile stays in registers).
            let pass = |first: usize, end: usize, mut acc: [[__m256; R]; NW]| {
                let mut i = first;
                while i + 8 <= end {
                    let mut wv = [_mm256_setzero_ps(); NW];
                    for j in 0..NW {
                        wv[j] = load_wf::<KIND>(w.add(j * ws + i * esz));
                    }
                    for r in 0..R {
                        let x = _mm256_loadu_ps(a.add(r * st + i));
                        for j in 0..NW {
                            acc[j][r] = _mm256_fmadd_ps(wv[j], x, acc[j][r]);
                        }
                    }
                    i += 16;
                }
                acc
            };
            let (mut a0, mut a1) = ([[_mm256_setzero_ps(); R]; NW], [[_mm256_setzero_ps(); R]; NW]);
            if NW * R == 1 {
                // Both accumulators in one walk: the steps alternate between them.
                let mut i = 0;
                while i + 16 <= n {
                    a0 = pass(i, i + 8, a0);
                    a1 = pass(i + 8, i + 16, a1);
                    i += 16;
                }
                a0 = pass(i, n, a0);
            } else {
                // Both passes over one 256-element chunk at a time, so the second finds the chunk
                // in L1; each accumulator still takes its steps in increasing order.
                let mut c = 0;
                while c + 8 <= n {
                    let end = (c + 256).min(n);
                    a0 = pass(c, end, a0);
                    a1 = pass(c + 8, end, a1);
                    c = end;
                }
            }
            let n8 = n / 8 * 8;
            for j in 0..NW {
                let mut tail = [0.0f32; R];
                for t in n8..n {
                    let wv = load_w1::<KIND>(w.add(j * ws + t * esz));
                    for r in 0..R {
                        tail[r] += wv * *a.add(r * st + t);
                    }
                }
                let sums: [__m256; R] = core::array::from_fn(|r| _mm256_add_ps(a0[j][r], a1[j][r]));
                store(&sums, &tail, out.add(j * MAX_ROWS));
            }
        }

        // ------------------------------------------------------------ Kernel entry points

        q0_entry!(k_q4_0, 0);
        q0_entry!(k_q5_0, 1);
        entry!($wide, k_q4_1, BlockQ8_1, q4_1_q5_1, false);
        entry!($wide, k_q5_1, BlockQ8_1, q4_1_q5_1, true);
        q0_entry!(k_q8_0, 2);
        entry!($wide, k_q4_k, BlockQ8K, q4k_q5k, false);
        entry!($wide, k_q4_k_vecdot, BlockQ8K, q4k_vecdot);
        entry!($wide, k_q5_k, BlockQ8K, q4k_q5k, true);
        entry!($wide, k_q6_k, BlockQ8K, q6k);
        entry!($wide, k_q2_k, BlockQ8K, q2k);
        entry!($wide, k_q3_k, BlockQ8K, q3k);
        float_entry!($maxw, $maxr, k_f32, 0);
        float_entry!($maxw, $maxr, k_f16, 1);
        float_entry!($maxw, $maxr, k_bf16, 2);
    };
}

pub(super) mod avx2 {
    kernels!("avx2,fma,f16c", helpers_avx2, false, 2, 4);
}

pub(super) mod avx512 {
    kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", helpers_avx512, true, 4, 4);
}

/// The AVX-512 prefill kernel of Q4_0 / Q5_0 / Q8_0 on 512-bit vectors: two activation rows per
/// vector. The weights offset to unsigned (`u = w + off`) and each lane's exact `Σ (u − off)·q`
/// from one `vpdpbusd` started at the precomputed `−off·Σq` of the lane
/// ([`BlockQ8_0x8::nls`](super::act::BlockQ8_0x8)), instead of [`avx512`]'s two `vpsignb` + one
/// `vpdpbusd` per row on 256 bits; the f32 step per row and block is the same
/// `acc = fma(d_w·d_x, float(lane), acc)` (the product taken lane-wise: the same value), so results
/// are bit-identical to the 256-bit kernel and to llama.cpp. Measured on Intel Xeon, where
/// 512-bit integer and FMA ops run at full width.
pub(super) mod avx512z {
    use super::super::act::BlockQ8_0x8;
    use super::super::{MAX_ROWS, MAX_W};
    use super::avx512::{f16, hsum, q0_bytes, q0_unpack};
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn q0_x8z<const KIND: u8>(w: *const u8, a: *const BlockQ8_0x8, nb: usize, out: *mut f32) {
        let bytes = q0_bytes::<KIND>();
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in 0..nb {
            let b = w.add(i * bytes);
            let y = &*a.add(i);
            let u = q0_unpack::<KIND>(b);
            let u2 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(u), u);
            let dw = _mm512_set1_ps(f16(b));
            for p in 0..4 {
                let yq = _mm512_loadu_si512(y.qs[2 * p].as_ptr() as *const _);
                let nl = _mm512_loadu_si512(y.nls[2 * p].as_ptr() as *const _);
                let dot = _mm512_dpbusd_epi32(nl, u2, yq);
                let d = _mm512_mul_ps(dw, _mm512_loadu_ps(y.d8[2 * p].as_ptr()));
                acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), acc[p]);
            }
        }
        for p in 0..4 {
            let lo = _mm512_castps512_ps256(acc[p]);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[p])));
            *out.add(2 * p) = hsum(lo);
            *out.add(2 * p + 1) = hsum(hi);
        }
    }

    macro_rules! x8z_entry {
        ($name:ident, $kind:expr) => {
            pub(in super::super) unsafe fn $name(w: *const u8, w_stride: usize, nw: usize, a: *const BlockQ8_0x8, nb: usize, out: *mut f32) {
                debug_assert!((1..=MAX_W).contains(&nw));
                for j in 0..nw {
                    q0_x8z::<$kind>(w.add(j * w_stride), a, nb, out.add(j * MAX_ROWS));
                }
            }
        };
    }
    x8z_entry!(k_q4_0_x8, 0);
    x8z_entry!(k_q5_0_x8, 1);
    x8z_entry!(k_q8_0_x8, 2);
}

/// `FAK_CPU_Q0_PREFILL=256`: the AVX-512 level's Q4_0/Q5_0/Q8_0 prefill on 256-bit vectors
/// ([`avx512`]'s `q0_x8`) instead of [`avx512z`] (same results; for CPUs that split 512-bit ops,
/// such as Zen 4, where it is not yet measured which is faster).
fn q0_prefill_256() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("FAK_CPU_Q0_PREFILL").is_ok_and(|v| v == "256"))
}

/// The Q4_K kernel of one x86 level for a matrix llama.cpp's x86 build does not repack (rows not
/// a multiple of 8): `ggml_vec_dot_q4_K_q8_K`'s arithmetic ([`avx2`]'s `q4k_vecdot`).
pub(super) fn q4k_unrepacked(avx512: bool) -> super::Kernel<super::act::BlockQ8K> {
    if avx512 { avx512::k_q4_k_vecdot } else { avx2::k_q4_k_vecdot }
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
    macro_rules! pickz {
        ($k:ident) => {
            if avx512 && !q0_prefill_256() { avx512z::$k } else { pick!($k) }
        };
    }
    Some(match t {
        G::Q4_0 => Plan::Q8_0x8(pick!(k_q4_0), pickz!(k_q4_0_x8)),
        G::Q5_0 => Plan::Q8_0x8(pick!(k_q5_0), pickz!(k_q5_0_x8)),
        G::Q8_0 => Plan::Q8_0x8(pick!(k_q8_0), pickz!(k_q8_0_x8)),
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
