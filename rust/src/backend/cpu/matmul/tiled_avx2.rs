//! The register-tiled Q4_K and Q6_K prefill of [`tiled`](super::tiled) on AVX2 (+FMA): the
//! machines without AVX-512 (AMD Zen 2/3, most desktop Intel). Same driver, same panels of 16
//! weight rows repacked per call, same exact integers and f32 steps as the AVX-512 kernels
//! ([`tiled_q4k`](super::tiled_q4k), [`tiled_q6k`](super::tiled_q6k): their module docs give the
//! arithmetic), so every output is bit-identical to them and to the one-row kernels.
//!
//! What AVX2 changes: no `vpdpbusd`, 8 i32 lanes per vector and 16 registers. A panel holds its
//! 16 rows as two halves of 8 (one per i32 lane of a `ymm`), and a tile is `R` activation rows ×
//! `V` halves ([`Q4_SHAPE`], [`Q6_SHAPE`]). The products are `vpmaddubsw` (u8 weight × i8
//! activation, pair sums in i16) of a weight vector with 4 activation bytes broadcast to every
//! lane — each lane a different weight row, as in llama.cpp's repacked GEMM, without its
//! shuffles (ggml-cpu `arch/x86/repack.cpp` `ggml_gemm_q4_K_8x8_q8_K` spends about one shuffle
//! per `vpmaddubsw` at AVX2). The i16 pair sums are added in i16 as far as they cannot overflow,
//! then weighted by the sub-block scales with one `vpmaddwd` into i32:
//!
//! - Q4_K: the nibbles are unpacked at repack time (`u` ≤ 15), so the inner loop is load,
//!   broadcast, `vpmaddubsw`, `vpaddw`; a 32-element sub-block's 8 pair sums in i16 stay within
//!   8·2·15·128 = 30720 (no saturation), then `vpmaddwd` by the scale in both i16 halves gives
//!   `sc·Σ u·q8` exactly; a pair of sub-blocks gives `isum` (< 2²⁴) in i32.
//! - Q6_K: `u` ≤ 63 (the −32 offset through `bsums`, as on AVX-512), so two `vpmaddubsw` add in
//!   i16 (2·2·63·128 = 32256) before `vpmaddwd` by the 16-element sub-block's signed scale.
//!
//! The sub-block loops of the full tiles are written in assembly ([`q4_sub_4x2`], [`q4_sub_2x2`],
//! [`q6_sub_2x2`]): from the intrinsics LLVM hoisted every weight load of a sub-block ahead of the
//! products and spilled them (Q4_K 2 × 16 tile: 131 → 165 GFLOP per CPU-second with the assembly).
//! The shapes fill the 16 `ymm` registers: Q4_K 4 rows × 16 columns is 8 i16 accumulators, 2
//! weight vectors, a broadcast and a product (0.75 loads per `vpmaddubsw`; 2 × 16 measured
//! 150–165 against 157–186 GFLOP per CPU-second), Q6_K 2 × 16 is 4 i32 accumulators, 4 weight
//! vectors, 2 scale vectors, 2 broadcasts and 2 products. Tiles with fewer rows (a tail, or a
//! row-order change) take the intrinsics.
//!
//! Against llama.cpp's AVX2 Q4_K GEMM: the same number of `vpmaddubsw` (32 products each, the
//! floor on AVX2), fewer than half the other vector instructions per `vpmaddubsw` (≈ 1.4 against
//! ≈ 3.2 counted in its source, half of those shuffles). Where one pipe executes `vpmaddubsw` the
//! two meet at that floor; on the Intel Xeon measured (two pipes) the Q4_K tile runs 160–186
//! GFLOP per CPU-second against the one-row kernel's 57–68 (2026-12-07).
//!
//! The repack (per call, as on AVX-512) goes 8 rows at a time through 8 × 8 dword transposes
//! ([`transpose8`]) of the quant bytes and of the unpacked scales ([`q4_scales8`],
//! [`q6_scales8`]); the AVX-512 panels use the same helpers (their byte layout is the two halves
//! side by side).

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use super::act::{BlockQ8K, LlamaRow};
use super::blocks;
use super::tiled::{TiledFormat, PANEL, TILE_ROWS};
use core::arch::x86_64::*;

/// Lanes of a `ymm` (weight rows per half panel).
const HALF: usize = PANEL / 2;

/// Q4_K tile shape `(R, V)`: activation rows × half panels per inner loop.
pub(super) const Q4_SHAPE: (usize, usize) = (4, 2);
/// Q6_K tile shape `(R, V)`.
pub(super) const Q6_SHAPE: (usize, usize) = (2, 2);

/// The 4 bytes at `p` broadcast to every dword lane.
#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// Stores lanes `..n` (≤ 8) of `v` at `out`.
#[inline(always)]
unsafe fn store_n(out: *mut f32, v: __m256, n: usize) {
    if n >= HALF {
        _mm256_storeu_ps(out, v);
    } else if n > 0 {
        let mut t = [0f32; HALF];
        _mm256_storeu_ps(t.as_mut_ptr(), v);
        core::ptr::copy_nonoverlapping(t.as_ptr(), out, n);
    }
}

// ---------------------------------------------------------------------------------------- Q4_K

/// One Q4_K super-block of 16 weight rows, repacked for AVX2.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Q4Panel {
    /// `[8s + g][h]`: lane `c` = row `8h + c`'s 4-bit values of sub-block `s`, elements `4g..4g+4`.
    q: [[[u8; 32]; 2]; 64],
    /// `[s][h]`: lane `c` = row `8h + c`'s scale of sub-block `s` in both i16 halves.
    sc: [[[i32; HALF]; 2]; 8],
    /// `[j][h]`: lane `c` = row `8h + c`'s mins of sub-blocks `2j` (low i16) and `2j + 1` (high).
    mn: [[[i32; HALF]; 2]; 4],
    d: [[f32; HALF]; 2],
    dmin: [[f32; HALF]; 2],
}

const Q4_ZERO: Q4Panel = Q4Panel { q: [[[0; 32]; 2]; 64], sc: [[[0; HALF]; 2]; 8], mn: [[[0; HALF]; 2]; 4], d: [[0.0; HALF]; 2], dmin: [[0.0; HALF]; 2] };

/// 8 rows of 8 dwords (`v[r]`) transposed: `out[g]` dword `r` = `v[r]` dword `g`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    let lo = |a, b| _mm256_unpacklo_epi32(a, b);
    let hi = |a, b| _mm256_unpackhi_epi32(a, b);
    // t: pairs of rows, dwords (0,1 | 4,5) and (2,3 | 6,7) interleaved.
    let t = [lo(v[0], v[1]), hi(v[0], v[1]), lo(v[2], v[3]), hi(v[2], v[3]), lo(v[4], v[5]), hi(v[4], v[5]), lo(v[6], v[7]), hi(v[6], v[7])];
    // u[k] (k < 4): rows 0..4, dwords k | k + 4; u[4 + k]: rows 4..8.
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    core::array::from_fn(|g| if g < 4 { _mm256_permute2x128_si256::<0x20>(u[g], u[4 + g]) } else { _mm256_permute2x128_si256::<0x31>(u[g - 4], u[g]) })
}

/// i16 `(a, b)` in each dword → `(a, a)` (`odd`: `(b, b)`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dup_half(v: __m256i, odd: bool) -> __m256i {
    // Byte indices within each 128-bit lane: dword d takes bytes 4d, 4d + 1 (or 4d + 2, 4d + 3) twice.
    let base = if odd { 0x0302_0302 } else { 0x0100_0100 };
    let m = _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 0x0404_0404, 0x0808_0808, 0x0c0c_0c0c, 0, 0x0404_0404, 0x0808_0808, 0x0c0c_0c0c));
    _mm256_shuffle_epi8(v, m)
}

/// 8 f16 values `h(c)` (0.0 where `c ≥ n`) as f32 lanes (F16C).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16x8(n: usize, h: impl Fn(usize) -> u16) -> __m256 {
    let b: [u16; 8] = core::array::from_fn(|c| if c < n { h(c) } else { 0 });
    _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr() as *const __m128i))
}

/// The scales of 8 Q4_K rows (`blk(c)`: row `c`'s block, `c < n`; lanes past `n` zero) in
/// lanes: `[k]` (`k < 4`) the 6-bit scales of sub-blocks `2k` (low i16) and `2k + 1` (high),
/// `[4 + j]` the mins of sub-blocks `2j`, `2j + 1`; then `d` and `dmin` as f32. ggml's
/// `get_scale_min_k4` unpacking (`utmp`) on 4 dword lanes per row, then [`transpose8`].
///
/// # Safety
/// AVX2 + F16C; each `blk(c)` points to a whole Q4_K block.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q4_scales8(blk: impl Fn(usize) -> *const u8, n: usize) -> ([__m256i; 8], __m256, __m256) {
    use blocks::q4_k::*;
    let row = |c: usize| {
        if c >= n {
            return _mm256_setzero_si256();
        }
        // The 12 scale bytes and 4 quant bytes after them: lanes [u0, u2, u1, u2 >> 4] and
        // [u0, u0 >> 2, u1, u1 >> 2] give [sc0..sc3, sc4..sc7, m0..m3, m4..m7].
        let v = _mm_loadu_si128(blk(c).add(SCALES) as *const __m128i);
        let x = _mm_srlv_epi32(_mm_shuffle_epi32::<0b10_01_10_00>(v), _mm_setr_epi32(0, 0, 0, 4));
        let y = _mm_srlv_epi32(_mm_shuffle_epi32::<0b01_01_00_00>(v), _mm_setr_epi32(0, 2, 0, 2));
        let y = _mm_and_si128(y, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
        let sm = _mm_or_si128(_mm_and_si128(x, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)), y);
        _mm256_cvtepu8_epi16(sm)
    };
    let t = transpose8(core::array::from_fn(row));
    let h16 = |c: usize, off: usize| (blk(c).add(off) as *const u16).read_unaligned();
    (t, f16x8(n, |c| h16(c, D)), f16x8(n, |c| h16(c, DMIN)))
}

/// The scales of 8 Q6_K rows (as [`q4_scales8`]): `[k]` the signed scales of sub-blocks `2k`
/// (low i16) and `2k + 1` (high), then `d` as f32.
///
/// # Safety
/// AVX2 + F16C; each `blk(c)` points to a whole Q6_K block.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q6_scales8(blk: impl Fn(usize) -> *const u8, n: usize) -> ([__m256i; 8], __m256) {
    use blocks::q6_k::*;
    let row = |c: usize| if c < n { _mm256_cvtepi8_epi16(_mm_loadu_si128(blk(c).add(SCALES) as *const __m128i)) } else { _mm256_setzero_si256() };
    let t = transpose8(core::array::from_fn(row));
    (t, f16x8(n, |c| (blk(c).add(D) as *const u16).read_unaligned()))
}

/// Repacks `rows` (≤ 16) Q4_K rows into `out[..nb]`: per pair of sub-blocks the 32 quant bytes
/// of 8 rows transposed 4 bytes at a time ([`transpose8`]), then split into low and high nibbles.
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2,f16c")]
unsafe fn q4_repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Q4Panel]) {
    use blocks::q4_k::*;
    let m4 = _mm256_set1_epi8(0xF);
    for (i, p) in out[..nb].iter_mut().enumerate() {
        if rows < PANEL {
            *p = Q4_ZERO;
        }
        for h in 0..rows.div_ceil(HALF) {
            let n = (rows - HALF * h).min(HALF);
            let blk = |c: usize| &w[(HALF * h + c) * row_bytes + i * BYTES..][..BYTES];
            for j in 0..4 {
                let v = core::array::from_fn(|c| if c < n { _mm256_loadu_si256(blk(c)[QS + 32 * j..].as_ptr() as *const __m256i) } else { _mm256_setzero_si256() });
                for (g, t) in transpose8(v).into_iter().enumerate() {
                    _mm256_store_si256(p.q[8 * (2 * j) + g][h].as_mut_ptr() as *mut __m256i, _mm256_and_si256(t, m4));
                    _mm256_store_si256(p.q[8 * (2 * j + 1) + g][h].as_mut_ptr() as *mut __m256i, _mm256_and_si256(_mm256_srli_epi16::<4>(t), m4));
                }
            }
            let (t, d, dmin) = q4_scales8(|c| blk(c).as_ptr(), n);
            let st = |dst: &mut [i32; HALF], v| _mm256_store_si256(dst.as_mut_ptr() as *mut __m256i, v);
            for k in 0..4 {
                st(&mut p.sc[2 * k][h], dup_half(t[k], false));
                st(&mut p.sc[2 * k + 1][h], dup_half(t[k], true));
                st(&mut p.mn[k][h], t[4 + k]);
            }
            _mm256_store_ps(p.d[h].as_mut_ptr(), d);
            _mm256_store_ps(p.dmin[h].as_mut_ptr(), dmin);
        }
    }
}

/// One Q4_K sub-block's 8 groups for 2 activation rows × both halves of a panel: the i16 pair-sum
/// accumulators `[r0·h0, r0·h1, r1·h0, r1·h1]` of `Σ_g vpmaddubsw(q[g][h], bcast(y_r + 4g))`.
/// Written out in assembly so that the 8 weight vectors are loaded once each in the order used
/// (the compiler's own schedule of the intrinsics hoisted all 16 loads and spilled them).
///
/// # Safety
/// `w` must point to 8 groups of 2 × 32 bytes (`Q4Panel::q[8s..8s + 8]`, 32-byte aligned), `y0`
/// and `y1` to 32 activation bytes each; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_sub_2x2(w: *const u8, y0: *const i8, y1: *const i8) -> [__m256i; 4] {
    let (a00, a01, a10, a11): (__m256i, __m256i, __m256i, __m256i);
    macro_rules! g {
        (first) => {
            concat!(
                "vmovdqa {w0}, ymmword ptr [{w}]\n",
                "vmovdqa {w1}, ymmword ptr [{w} + 32]\n",
                "vpbroadcastd {b}, dword ptr [{y0}]\n",
                "vpmaddubsw {a00}, {w0}, {b}\n",
                "vpmaddubsw {a01}, {w1}, {b}\n",
                "vpbroadcastd {b}, dword ptr [{y1}]\n",
                "vpmaddubsw {a10}, {w0}, {b}\n",
                "vpmaddubsw {a11}, {w1}, {b}\n",
            )
        };
        ($ow0:literal, $ow1:literal, $oy:literal) => {
            concat!(
                "vmovdqa {w0}, ymmword ptr [{w} + ", $ow0, "]\n",
                "vmovdqa {w1}, ymmword ptr [{w} + ", $ow1, "]\n",
                "vpbroadcastd {b}, dword ptr [{y0} + ", $oy, "]\n",
                "vpmaddubsw {t}, {w0}, {b}\n",
                "vpaddw {a00}, {a00}, {t}\n",
                "vpmaddubsw {t}, {w1}, {b}\n",
                "vpaddw {a01}, {a01}, {t}\n",
                "vpbroadcastd {b}, dword ptr [{y1} + ", $oy, "]\n",
                "vpmaddubsw {t}, {w0}, {b}\n",
                "vpaddw {a10}, {a10}, {t}\n",
                "vpmaddubsw {t}, {w1}, {b}\n",
                "vpaddw {a11}, {a11}, {t}\n",
            )
        };
    }
    core::arch::asm!(
        g!(first),
        g!(64, 96, 4),
        g!(128, 160, 8),
        g!(192, 224, 12),
        g!(256, 288, 16),
        g!(320, 352, 20),
        g!(384, 416, 24),
        g!(448, 480, 28),
        w = in(reg) w, y0 = in(reg) y0, y1 = in(reg) y1,
        w0 = out(ymm_reg) _, w1 = out(ymm_reg) _, b = out(ymm_reg) _, t = out(ymm_reg) _,
        a00 = out(ymm_reg) a00, a01 = out(ymm_reg) a01, a10 = out(ymm_reg) a10, a11 = out(ymm_reg) a11,
        options(pure, readonly, nostack, preserves_flags),
    );
    [a00, a01, a10, a11]
}

/// [`q4_sub_2x2`] for 4 activation rows: `[r0·h0, r0·h1, r1·h0, ..., r3·h1]`.
///
/// # Safety
/// As [`q4_sub_2x2`], with 4 activation rows.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_sub_4x2(w: *const u8, y: [*const i8; 4]) -> [__m256i; 8] {
    let (a00, a01, a10, a11, a20, a21, a30, a31): (__m256i, __m256i, __m256i, __m256i, __m256i, __m256i, __m256i, __m256i);
    macro_rules! row {
        (first, $y:literal, $a0:literal, $a1:literal) => {
            concat!(
                "vpbroadcastd {b}, dword ptr [{", $y, "}]\n",
                "vpmaddubsw {", $a0, "}, {w0}, {b}\n",
                "vpmaddubsw {", $a1, "}, {w1}, {b}\n",
            )
        };
        ($oy:literal, $y:literal, $a0:literal, $a1:literal) => {
            concat!(
                "vpbroadcastd {b}, dword ptr [{", $y, "} + ", $oy, "]\n",
                "vpmaddubsw {t}, {w0}, {b}\n",
                "vpaddw {", $a0, "}, {", $a0, "}, {t}\n",
                "vpmaddubsw {t}, {w1}, {b}\n",
                "vpaddw {", $a1, "}, {", $a1, "}, {t}\n",
            )
        };
    }
    macro_rules! g {
        ($ow0:literal, $ow1:literal, $oy:tt) => {
            concat!(
                "vmovdqa {w0}, ymmword ptr [{w} + ", $ow0, "]\n",
                "vmovdqa {w1}, ymmword ptr [{w} + ", $ow1, "]\n",
                row!($oy, "y0", "a00", "a01"),
                row!($oy, "y1", "a10", "a11"),
                row!($oy, "y2", "a20", "a21"),
                row!($oy, "y3", "a30", "a31"),
            )
        };
    }
    core::arch::asm!(
        g!(0, 32, first),
        g!(64, 96, 4),
        g!(128, 160, 8),
        g!(192, 224, 12),
        g!(256, 288, 16),
        g!(320, 352, 20),
        g!(384, 416, 24),
        g!(448, 480, 28),
        w = in(reg) w, y0 = in(reg) y[0], y1 = in(reg) y[1], y2 = in(reg) y[2], y3 = in(reg) y[3],
        w0 = out(ymm_reg) _, w1 = out(ymm_reg) _, b = out(ymm_reg) _, t = out(ymm_reg) _,
        a00 = out(ymm_reg) a00, a01 = out(ymm_reg) a01, a10 = out(ymm_reg) a10, a11 = out(ymm_reg) a11,
        a20 = out(ymm_reg) a20, a21 = out(ymm_reg) a21, a30 = out(ymm_reg) a30, a31 = out(ymm_reg) a31,
        options(pure, readonly, nostack, preserves_flags),
    );
    [a00, a01, a10, a11, a20, a21, a30, a31]
}

/// `out[r·out_stride + 8v + c] = W_row(8(h0 + v) + c) · a_row(r)` for `r < R`, `v < V`,
/// `8v + c < cols`: `R` activation rows against halves `h0..h0 + V` of a panel of `nb`
/// super-blocks, in the [`LlamaRow::gemm4`] order if `GEMM4`, else the GEMV order (the f32 steps
/// of [`tiled_q4k`](super::tiled_q4k), see there).
///
/// # Safety
/// `p` must hold `nb` panels, `a`/`bsp` `R` rows of `st` (≥ `nb`), `out` `R` rows of `cols`
/// floats; the CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_tile<const R: usize, const V: usize, const GEMM4: bool>(p: *const Q4Panel, h0: usize, nb: usize, a: *const BlockQ8K, bsp: *const [i32; 4], st: usize, out: *mut f32, out_stride: usize, cols: usize) {
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    let mut accm = [[_mm256_setzero_ps(); V]; R];
    for i in 0..nb {
        let pb = &*p.add(i);
        let ys: [*const BlockQ8K; R] = core::array::from_fn(|r| a.add(r * st + i));
        let mut tot = [[zero; V]; R];
        let mut totm = [[zero; V]; R];
        for j in 0..4 {
            let mut isum = [[zero; V]; R];
            for hs in 0..2 {
                let s = 2 * j + hs;
                let mut s16 = [[zero; V]; R];
                if R == 2 && V == 2 {
                    let o = s16.as_mut_ptr() as *mut __m256i;
                    let [a00, a01, a10, a11] = q4_sub_2x2(pb.q[8 * s].as_ptr() as *const u8, (*ys[0]).qs.as_ptr().add(32 * s), (*ys[1]).qs.as_ptr().add(32 * s));
                    (*o, *o.add(1), *o.add(2), *o.add(3)) = (a00, a01, a10, a11);
                } else if R == 4 && V == 2 {
                    let o = s16.as_mut_ptr() as *mut [__m256i; 8];
                    let q = |r: usize| (*ys[r]).qs.as_ptr().add(32 * s);
                    *o = q4_sub_4x2(pb.q[8 * s].as_ptr() as *const u8, [q(0), q(1), q(2), q(3)]);
                } else {
                    for g in 0..8 {
                        let wv: [__m256i; V] = core::array::from_fn(|v| _mm256_load_si256(pb.q[8 * s + g][h0 + v].as_ptr() as *const __m256i));
                        for r in 0..R {
                            let y = bcast((*ys[r]).qs.as_ptr().add(32 * s + 4 * g));
                            for v in 0..V {
                                s16[r][v] = _mm256_add_epi16(s16[r][v], _mm256_maddubs_epi16(wv[v], y));
                            }
                        }
                    }
                }
                for v in 0..V {
                    let sc = _mm256_load_si256(pb.sc[s][h0 + v].as_ptr() as *const __m256i);
                    for r in 0..R {
                        isum[r][v] = _mm256_add_epi32(isum[r][v], _mm256_madd_epi16(s16[r][v], sc));
                    }
                }
            }
            for v in 0..V {
                let mn = _mm256_load_si256(pb.mn[j][h0 + v].as_ptr() as *const __m256i);
                for r in 0..R {
                    let imin = _mm256_madd_epi16(mn, _mm256_set1_epi32((*bsp.add(r * st + i))[j]));
                    if GEMM4 {
                        let dy = _mm256_set1_ps((*ys[r]).d);
                        let dv = _mm256_load_ps(pb.d[h0 + v].as_ptr());
                        let dmv = _mm256_load_ps(pb.dmin[h0 + v].as_ptr());
                        acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][v]), _mm256_mul_ps(dv, dy), acc[r][v]);
                        accm[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmv, dy), accm[r][v]);
                    } else {
                        tot[r][v] = _mm256_add_epi32(tot[r][v], isum[r][v]);
                        totm[r][v] = _mm256_add_epi32(totm[r][v], imin);
                    }
                }
            }
        }
        if !GEMM4 {
            for v in 0..V {
                let dv = _mm256_load_ps(pb.d[h0 + v].as_ptr());
                let dmv = _mm256_load_ps(pb.dmin[h0 + v].as_ptr());
                for r in 0..R {
                    let dy = _mm256_set1_ps((*ys[r]).d);
                    acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[r][v]), _mm256_mul_ps(dv, dy), acc[r][v]);
                    accm[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totm[r][v]), _mm256_mul_ps(dmv, dy), accm[r][v]);
                }
            }
        }
    }
    for r in 0..R {
        for v in 0..V {
            store_n(out.add(r * out_stride + HALF * v), _mm256_sub_ps(acc[r][v], accm[r][v]), cols.saturating_sub(HALF * v));
        }
    }
}

/// Runs a tile kernel `$k::<R, V, ..>` over `nr` (1..=[`TILE_ROWS`]) rows and both halves of a
/// panel, in tiles of `$shape` = (R, V).
macro_rules! over_tile {
    ($shape:expr, $k:ident, $nr:expr, $p:expr, $nb:expr, $a:expr, $aux:expr, $out:expr, $os:expr, $cols:expr $(, $c:tt)*) => {{
        let shape: (usize, usize) = $shape;
        let (nr, cols) = ($nr, $cols);
        let mut r = 0;
        while r < nr {
            let rr = (nr - r).min(shape.0);
            let mut h = 0;
            while h < 2 && HALF * h < cols {
                let (a, aux, out) = ($a.add(r * $nb), $aux.wrapping_add(r * $nb), $out.add(r * $os + HALF * h));
                let c = cols - HALF * h;
                macro_rules! go {
                    ($rr:literal) => {
                        if shape.1 == 2 && h == 0 {
                            $k::<$rr, 2 $(, $c)*>($p, 0, $nb, a, aux, $nb, out, $os, c)
                        } else {
                            $k::<$rr, 1 $(, $c)*>($p, h, $nb, a, aux, $nb, out, $os, c)
                        }
                    };
                }
                match rr {
                    1 => go!(1),
                    2 => go!(2),
                    3 => go!(3),
                    _ => go!(4),
                }
                h += if shape.1 == 2 && h == 0 { 2 } else { 1 };
            }
            r += rr;
        }
    }};
}

/// Q4_K in the tiled driver on AVX2: every row in its own order (GEMM4 or GEMV).
pub(super) struct Q4KAvx2;

impl TiledFormat for Q4KAvx2 {
    type Panel = Q4Panel;
    const ZERO: Q4Panel = Q4_ZERO;
    const BYTES: usize = blocks::q4_k::BYTES;
    fn mode(row: LlamaRow) -> Option<bool> {
        Some(row.gemm4)
    }
    fn aux(a: &[BlockQ8K]) -> Vec<[i32; 4]> {
        super::tiled_q4k::pair_bsums(a)
    }
    unsafe fn repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Q4Panel]) {
        q4_repack(w, row_bytes, rows, nb, out)
    }
    unsafe fn tile(mode: bool, nr: usize, p: *const Q4Panel, nb: usize, a: *const BlockQ8K, aux: *const [i32; 4], out: *mut f32, out_stride: usize, cols: usize) {
        debug_assert!((1..=TILE_ROWS).contains(&nr));
        if mode {
            over_tile!(Q4_SHAPE, q4_tile, nr, p, nb, a, aux, out, out_stride, cols, true)
        } else {
            over_tile!(Q4_SHAPE, q4_tile, nr, p, nb, a, aux, out, out_stride, cols, false)
        }
    }
}

// ---------------------------------------------------------------------------------------- Q6_K

/// One Q6_K super-block of 16 weight rows, repacked for AVX2.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Q6Panel {
    /// `[t][h]`: lane `c` = row `8h + c`'s 6-bit values of elements `4t..4t+4`.
    u: [[[u8; 32]; 2]; 64],
    /// `[s][h]`: lane `c` = row `8h + c`'s signed scale of sub-block `s` in both i16 halves.
    sc: [[[i32; HALF]; 2]; 16],
    /// `[k][h]`: lane `c` = row `8h + c`'s scales of sub-blocks `2k` (low i16) and `2k + 1` (high).
    scp: [[[i32; HALF]; 2]; 8],
    d: [[f32; HALF]; 2],
}

const Q6_ZERO: Q6Panel = Q6Panel { u: [[[0; 32]; 2]; 64], sc: [[[0; HALF]; 2]; 16], scp: [[[0; HALF]; 2]; 8], d: [[0.0; HALF]; 2] };

/// The 32 6-bit values `u` (0..63, before the −32 offset) of elements `32k..32k + 32` of the Q6_K
/// block at `b`: ggml's layout, in half `n` quarter `t` (`k = 4n + t`) the low (`t` < 2) or high
/// nibbles of `ql[64n + 32·(t mod 2) + l]` and bits `2t, 2t + 1` of `qh[32n + l]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn u6_quarter(b: *const u8, k: usize) -> __m256i {
    use blocks::q6_k::*;
    let (n, t) = (k / 4, k % 4);
    let ql = _mm256_loadu_si256(b.add(QL + 64 * n + 32 * (t % 2)) as *const __m256i);
    let qh = _mm256_loadu_si256(b.add(QH + 32 * n) as *const __m256i);
    let lo = if t < 2 { ql } else { _mm256_srli_epi16::<4>(ql) };
    let hb = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t as i32));
    let m = |x| _mm256_set1_epi8(x);
    _mm256_or_si256(_mm256_and_si256(lo, m(0xF)), _mm256_slli_epi16::<4>(_mm256_and_si256(hb, m(3))))
}

/// Repacks `rows` (≤ 16) Q6_K rows into `out[..nb]`: the 6-bit values of 8 rows assembled 32 at a
/// time ([`u6_quarter`]) and transposed 4 bytes at a time ([`transpose8`]).
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2,f16c")]
unsafe fn q6_repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Q6Panel]) {
    use blocks::q6_k::*;
    for (i, p) in out[..nb].iter_mut().enumerate() {
        if rows < PANEL {
            *p = Q6_ZERO;
        }
        for h in 0..rows.div_ceil(HALF) {
            let n = (rows - HALF * h).min(HALF);
            let blk = |c: usize| &w[(HALF * h + c) * row_bytes + i * BYTES..][..BYTES];
            for k in 0..8 {
                let v = core::array::from_fn(|c| if c < n { u6_quarter(blk(c).as_ptr(), k) } else { _mm256_setzero_si256() });
                for (g, t) in transpose8(v).into_iter().enumerate() {
                    _mm256_store_si256(p.u[8 * k + g][h].as_mut_ptr() as *mut __m256i, t);
                }
            }
            let (t, d) = q6_scales8(|c| blk(c).as_ptr(), n);
            let st = |dst: &mut [i32; HALF], v| _mm256_store_si256(dst.as_mut_ptr() as *mut __m256i, v);
            for k in 0..8 {
                st(&mut p.scp[k][h], t[k]);
                st(&mut p.sc[2 * k][h], dup_half(t[k], false));
                st(&mut p.sc[2 * k + 1][h], dup_half(t[k], true));
            }
            _mm256_store_ps(p.d[h].as_mut_ptr(), d);
        }
    }
}

/// One Q6_K sub-block (16 elements: 4 groups) for 2 activation rows × both halves of a panel:
/// `tot[r·2 + h] += vpmaddwd(Σ_pair vpmaddubsw(u[g][h], bcast(y_r + 4g)), sc_h)` over the two
/// pairs of groups, in assembly (as [`q4_sub_2x2`]).
///
/// # Safety
/// `u` must point to 4 groups of 2 × 32 bytes (`Q6Panel::u[4s..4s + 4]`, 32-byte aligned), `y0`
/// and `y1` to 16 activation bytes each; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q6_sub_2x2(u: *const u8, y0: *const i8, y1: *const i8, sc0: __m256i, sc1: __m256i, tot: [__m256i; 4]) -> [__m256i; 4] {
    let [mut t00, mut t01, mut t10, mut t11] = tot;
    macro_rules! row {
        ($y:literal, $oy0:literal, $oy1:literal, $t0:literal, $t1:literal) => {
            concat!(
                "vpbroadcastd {b0}, dword ptr [{", $y, "} + ", $oy0, "]\n",
                "vpbroadcastd {b1}, dword ptr [{", $y, "} + ", $oy1, "]\n",
                "vpmaddubsw {p}, {u0}, {b0}\n",
                "vpmaddubsw {q}, {u1}, {b1}\n",
                "vpaddw {p}, {p}, {q}\n",
                "vpmaddwd {p}, {p}, {sc0}\n",
                "vpaddd {", $t0, "}, {", $t0, "}, {p}\n",
                "vpmaddubsw {p}, {u2}, {b0}\n",
                "vpmaddubsw {q}, {u3}, {b1}\n",
                "vpaddw {p}, {p}, {q}\n",
                "vpmaddwd {p}, {p}, {sc1}\n",
                "vpaddd {", $t1, "}, {", $t1, "}, {p}\n",
            )
        };
    }
    macro_rules! pair {
        ($g0:literal, $g1:literal, $h0:literal, $h1:literal, $oy0:literal, $oy1:literal) => {
            concat!(
                "vmovdqa {u0}, ymmword ptr [{u} + ", $g0, "]\n",
                "vmovdqa {u1}, ymmword ptr [{u} + ", $g1, "]\n",
                "vmovdqa {u2}, ymmword ptr [{u} + ", $h0, "]\n",
                "vmovdqa {u3}, ymmword ptr [{u} + ", $h1, "]\n",
                row!("y0", $oy0, $oy1, "t00", "t01"),
                row!("y1", $oy0, $oy1, "t10", "t11"),
            )
        };
    }
    core::arch::asm!(
        pair!(0, 64, 32, 96, 0, 4),
        pair!(128, 192, 160, 224, 8, 12),
        u = in(reg) u, y0 = in(reg) y0, y1 = in(reg) y1, sc0 = in(ymm_reg) sc0, sc1 = in(ymm_reg) sc1,
        u0 = out(ymm_reg) _, u1 = out(ymm_reg) _, u2 = out(ymm_reg) _, u3 = out(ymm_reg) _,
        b0 = out(ymm_reg) _, b1 = out(ymm_reg) _, p = out(ymm_reg) _, q = out(ymm_reg) _,
        t00 = inout(ymm_reg) t00, t01 = inout(ymm_reg) t01, t10 = inout(ymm_reg) t10, t11 = inout(ymm_reg) t11,
        options(pure, readonly, nostack, preserves_flags),
    );
    [t00, t01, t10, t11]
}

/// `out[r·out_stride + 8v + c] = W_row(8(h0 + v) + c) · a_row(r)` in the tiled-kernel order of
/// [`tiled_q6k`](super::tiled_q6k) (`isum = Σ_s sc_s·Σ u·q8 − 32·Σ_s sc_s·bsum_s`, then
/// `out = fma(float(isum)·d, d_x, out)`).
///
/// # Safety
/// As [`q4_tile`] (`_aux` unused).
#[target_feature(enable = "avx2,fma")]
unsafe fn q6_tile<const R: usize, const V: usize>(p: *const Q6Panel, h0: usize, nb: usize, a: *const BlockQ8K, _aux: *const [i32; 4], st: usize, out: *mut f32, out_stride: usize, cols: usize) {
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    for i in 0..nb {
        let pb = &*p.add(i);
        let ys: [*const BlockQ8K; R] = core::array::from_fn(|r| a.add(r * st + i));
        // −32·Σ_s sc_s·bsum_s, then Σ_s sc_s·Σ u·q8 on top: isum.
        let mut off = [[zero; V]; R];
        for k in 0..8 {
            for v in 0..V {
                let scp = _mm256_load_si256(pb.scp[k][h0 + v].as_ptr() as *const __m256i);
                for r in 0..R {
                    let bs = ((*ys[r]).bsums.as_ptr().add(2 * k) as *const i32).read_unaligned();
                    off[r][v] = _mm256_add_epi32(off[r][v], _mm256_madd_epi16(scp, _mm256_set1_epi32(bs)));
                }
            }
        }
        let mut tot: [[__m256i; V]; R] = core::array::from_fn(|r| core::array::from_fn(|v| _mm256_sub_epi32(zero, _mm256_slli_epi32::<5>(off[r][v]))));
        for s in 0..16 {
            if R == 2 && V == 2 {
                let o = tot.as_mut_ptr() as *mut __m256i;
                let sc = |v: usize| _mm256_load_si256(pb.sc[s][v].as_ptr() as *const __m256i);
                let q = |r: usize| (*ys[r]).qs.as_ptr().add(16 * s);
                let t = q6_sub_2x2(pb.u[4 * s].as_ptr() as *const u8, q(0), q(1), sc(0), sc(1), [*o, *o.add(1), *o.add(2), *o.add(3)]);
                (*o, *o.add(1), *o.add(2), *o.add(3)) = (t[0], t[1], t[2], t[3]);
                continue;
            }
            for half in 0..2 {
                let t0 = 4 * s + 2 * half;
                let u0: [__m256i; V] = core::array::from_fn(|v| _mm256_load_si256(pb.u[t0][h0 + v].as_ptr() as *const __m256i));
                let u1: [__m256i; V] = core::array::from_fn(|v| _mm256_load_si256(pb.u[t0 + 1][h0 + v].as_ptr() as *const __m256i));
                for r in 0..R {
                    let q = (*ys[r]).qs.as_ptr().add(4 * t0);
                    let (y0, y1) = (bcast(q), bcast(q.add(4)));
                    for v in 0..V {
                        let sc = _mm256_load_si256(pb.sc[s][h0 + v].as_ptr() as *const __m256i);
                        let pair = _mm256_add_epi16(_mm256_maddubs_epi16(u0[v], y0), _mm256_maddubs_epi16(u1[v], y1));
                        tot[r][v] = _mm256_add_epi32(tot[r][v], _mm256_madd_epi16(pair, sc));
                    }
                }
            }
        }
        for v in 0..V {
            let d = _mm256_load_ps(pb.d[h0 + v].as_ptr());
            for r in 0..R {
                acc[r][v] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(tot[r][v]), d), _mm256_set1_ps((*ys[r]).d), acc[r][v]);
            }
        }
    }
    for r in 0..R {
        for v in 0..V {
            store_n(out.add(r * out_stride + HALF * v), acc[r][v], cols.saturating_sub(HALF * v));
        }
    }
}

/// Q6_K in the tiled driver on AVX2: rows of llama.cpp's tiled kernel only.
pub(super) struct Q6KAvx2;

impl TiledFormat for Q6KAvx2 {
    type Panel = Q6Panel;
    const ZERO: Q6Panel = Q6_ZERO;
    const BYTES: usize = blocks::q6_k::BYTES;
    fn mode(row: LlamaRow) -> Option<bool> {
        row.tiled.then_some(true)
    }
    fn aux(_: &[BlockQ8K]) -> Vec<[i32; 4]> {
        Vec::new()
    }
    unsafe fn repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Q6Panel]) {
        q6_repack(w, row_bytes, rows, nb, out)
    }
    unsafe fn tile(_: bool, nr: usize, p: *const Q6Panel, nb: usize, a: *const BlockQ8K, aux: *const [i32; 4], out: *mut f32, out_stride: usize, cols: usize) {
        debug_assert!((1..=TILE_ROWS).contains(&nr));
        over_tile!(Q6_SHAPE, q6_tile, nr, p, nb, a, aux, out, out_stride, cols)
    }
}
