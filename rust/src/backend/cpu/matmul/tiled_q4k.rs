//! The Q4_K × Q8_K prefill kernel of [`tiled`](super::tiled): 16 weight rows (one per i32 lane
//! of a `zmm`) × up to [`TILE_ROWS`](super::tiled::TILE_ROWS) activation rows per inner loop, as llama.cpp's repacked
//! `block_q4_Kx8` GEMM lays a tile out (ggml-cpu `arch/x86/repack.cpp`: weights interleaved so
//! that a lane is an output column, activations broadcast 4 bytes at a time into `vpdpbusd`).
//!
//! The weights are repacked per call, 16 rows at a time ([`Panel`]): for every super-block the
//! 128 quant bytes of each row are transposed so that dword lane `c` of vector `8j + g` holds row
//! `c`'s bytes `32j + 4g .. 32j + 4g + 4` (low nibbles: sub-block `2j`, high: `2j + 1`), and the
//! 6-bit scales, mins, `d` and `dmin` are unpacked into lanes. The mmapped GGUF is never changed;
//! the panel (2944 bytes per super-block) is reused by every activation row of the call.
//!
//! Exactness: the integers are the ones of the one-row kernel (`x86.rs`, `q4k_q5k`): each
//! sub-block's `Σ u·q8` (≤ 32·15·128 in magnitude) exactly in an i32 lane, the pair total
//! `isum = sc_lo·Σlo + sc_hi·Σhi` (≤ 7.8·10⁶ < 2²⁴: exact in f32, formed by one multiply and one
//! FMA of exact integers), `imin = m_lo·bs_lo + m_hi·bs_hi` from one `vpdpwssd`; the f32 steps
//! per output are the same operations in the same order (`acc = fma(isum, d·d_x, acc)`,
//! `acc_min = fma(imin, dmin·d_x, acc_min)` per pair of sub-blocks for a [`LlamaRow::gemm4`] row,
//! per super-block on the block totals otherwise; result `acc − acc_min`). So every output is
//! bit-identical to the one-row kernel, and to llama.cpp (tests: `tiled_bit_identical`).
//!
//! [`LlamaRow::gemm4`]: super::act::LlamaRow

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use super::act::{BlockQ8K, LlamaRow};
use super::blocks;
use super::tiled::{TiledFormat, PANEL, TILE_ROWS};
use super::tiled_avx2::{q4_scales8, transpose8};
use core::arch::x86_64::*;

/// One super-block of 16 weight rows, repacked (see the module docs).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Panel {
    /// `[8j + g]`: lane `c` = row `c`'s quant bytes `32j + 4g .. +4`.
    qs: [[u8; 64]; 32],
    /// `[s]`: lane `c` = row `c`'s 6-bit scale of sub-block `s`, as f32.
    sc: [[f32; PANEL]; 8],
    /// `[j]`: lane `c` = row `c`'s mins of sub-blocks `2j` (low i16) and `2j + 1` (high i16).
    mn: [[i32; PANEL]; 4],
    d: [f32; PANEL],
    dmin: [f32; PANEL],
}

const ZERO_PANEL: Panel = Panel { qs: [[0; 64]; 32], sc: [[0.0; PANEL]; 8], mn: [[0; PANEL]; 4], d: [0.0; PANEL], dmin: [0.0; PANEL] };

/// Repacks weight rows `rows` (≤ 16, each `nb` Q4_K blocks, `row_bytes` apart from `w`) into
/// `out[..nb]`; lanes past `rows` get zero weights and scales. The quant bytes go 8 rows at a
/// time through an AVX2 transpose of 4-byte groups ([`transpose8`]), the scales likewise
/// ([`q4_scales8`]).
///
/// # Safety
/// AVX2 + F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Panel]) {
    use blocks::q4_k::*;
    for (i, p) in out[..nb].iter_mut().enumerate() {
        if rows < PANEL {
            *p = ZERO_PANEL;
        }
        for h in 0..rows.div_ceil(8) {
            let n = (rows - 8 * h).min(8);
            for j in 0..4 {
                let v = core::array::from_fn(|c| if c < n { _mm256_loadu_si256(w[(8 * h + c) * row_bytes + i * BYTES + QS + 32 * j..][..32].as_ptr() as *const __m256i) } else { _mm256_setzero_si256() });
                for (g, t) in transpose8(v).into_iter().enumerate() {
                    _mm256_store_si256(p.qs[8 * j + g][32 * h..].as_mut_ptr() as *mut __m256i, t);
                }
            }
            let (t, d, dmin) = q4_scales8(|c| w[(8 * h + c) * row_bytes + i * BYTES..][..BYTES].as_ptr(), n);
            for k in 0..4 {
                let lo = _mm256_and_si256(t[k], _mm256_set1_epi32(0xFFFF));
                _mm256_storeu_ps(p.sc[2 * k][8 * h..].as_mut_ptr(), _mm256_cvtepi32_ps(lo));
                _mm256_storeu_ps(p.sc[2 * k + 1][8 * h..].as_mut_ptr(), _mm256_cvtepi32_ps(_mm256_srli_epi32::<16>(t[k])));
                _mm256_storeu_si256(p.mn[k][8 * h..].as_mut_ptr() as *mut __m256i, t[4 + k]);
            }
            _mm256_storeu_ps(p.d[8 * h..].as_mut_ptr(), d);
            _mm256_storeu_ps(p.dmin[8 * h..].as_mut_ptr(), dmin);
        }
    }
}

/// Per activation row and super-block, the Q8_K sums of the 4 sub-block pairs as `vpdpwssd`
/// operands: word `j` = the sums of sub-blocks `2j` (low i16) and `2j + 1` (high i16), each
/// ≤ 32·128 in magnitude.
pub(super) fn pair_bsums(a: &[BlockQ8K]) -> Vec<[i32; 4]> {
    a.iter()
        .map(|y| {
            let s = |k: usize| (y.bsums[2 * k] as i32 + y.bsums[2 * k + 1] as i32) as i16 as u16 as i32;
            core::array::from_fn(|j| s(2 * j) | s(2 * j + 1) << 16)
        })
        .collect()
}

/// `out[r·out_stride + c] = W_row(c) · a_row(r)` for `r < R`, `c < cols`: one panel of `nb`
/// super-blocks against `R` activation rows (`st` blocks apart from `a`, pair sums `bsp` likewise),
/// in the [`LlamaRow::gemm4`](super::act::LlamaRow) order if `GEMM4`, else the GEMV order.
///
/// # Safety
/// `p` must hold `nb` panels, `a`/`bsp` `R` rows of `nb`, `out` `R` rows of `cols` (≤ 16) floats,
/// and the CPU must support AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const GEMM4: bool>(p: *const Panel, nb: usize, a: *const BlockQ8K, bsp: *const [i32; 4], st: usize, out: *mut f32, out_stride: usize, cols: usize) {
    let m4 = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        let pb = &*p.add(i);
        let dv = _mm512_load_ps(pb.d.as_ptr());
        let dmv = _mm512_load_ps(pb.dmin.as_ptr());
        let ys: [*const BlockQ8K; R] = core::array::from_fn(|r| a.add(r * st + i));
        let mut tot = [zero; R];
        let mut totm = [zero; R];
        for j in 0..4 {
            let mut slo = [zero; R];
            let mut shi = [zero; R];
            for g in 0..8 {
                let q = _mm512_load_si512(pb.qs[8 * j + g].as_ptr() as *const _);
                let lo = _mm512_and_si512(q, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                for r in 0..R {
                    let y = (*ys[r]).qs.as_ptr().add(64 * j + 4 * g) as *const i32;
                    slo[r] = _mm512_dpbusd_epi32(slo[r], lo, _mm512_set1_epi32(y.read_unaligned()));
                    shi[r] = _mm512_dpbusd_epi32(shi[r], hi, _mm512_set1_epi32(y.add(8).read_unaligned()));
                }
            }
            let sl = _mm512_load_ps(pb.sc[2 * j].as_ptr());
            let sh = _mm512_load_ps(pb.sc[2 * j + 1].as_ptr());
            let mn = _mm512_load_si512(pb.mn[j].as_ptr() as *const _);
            for r in 0..R {
                // Exact: integer products and sum below 2^24.
                let isum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(slo[r]), sl, _mm512_mul_ps(_mm512_cvtepi32_ps(shi[r]), sh));
                let imin = _mm512_dpwssd_epi32(zero, mn, _mm512_set1_epi32((*bsp.add(r * st + i))[j]));
                if GEMM4 {
                    let dy = _mm512_set1_ps((*ys[r]).d);
                    acc[r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dv, dy), acc[r]);
                    accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dmv, dy), accm[r]);
                } else {
                    tot[r] = _mm512_add_epi32(tot[r], _mm512_cvtps_epi32(isum));
                    totm[r] = _mm512_add_epi32(totm[r], imin);
                }
            }
        }
        if !GEMM4 {
            for r in 0..R {
                let dy = _mm512_set1_ps((*ys[r]).d);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[r]), _mm512_mul_ps(dv, dy), acc[r]);
                accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(totm[r]), _mm512_mul_ps(dmv, dy), accm[r]);
            }
        }
    }
    let mask: __mmask16 = if cols >= PANEL { 0xFFFF } else { (1u16 << cols) - 1 };
    for r in 0..R {
        _mm512_mask_storeu_ps(out.add(r * out_stride), mask, _mm512_sub_ps(acc[r], accm[r]));
    }
}

/// [`tile`] for `nr` (1..=[`TILE_ROWS`]) rows of one mode.
unsafe fn tile_n(gemm4: bool, nr: usize, p: *const Panel, nb: usize, a: *const BlockQ8K, bsp: *const [i32; 4], out: *mut f32, out_stride: usize, cols: usize) {
    macro_rules! go {
        ($r:literal) => {
            if gemm4 {
                tile::<$r, true>(p, nb, a, bsp, nb, out, out_stride, cols)
            } else {
                tile::<$r, false>(p, nb, a, bsp, nb, out, out_stride, cols)
            }
        };
    }
    debug_assert!((1..=TILE_ROWS).contains(&nr));
    match nr {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        _ => go!(4),
    }
}

/// Q4_K in the tiled driver: every row in its own order (GEMM4 or GEMV), none left to the
/// one-row kernel.
pub(super) struct Q4K;

impl TiledFormat for Q4K {
    type Panel = Panel;
    const ZERO: Panel = ZERO_PANEL;
    const BYTES: usize = blocks::q4_k::BYTES;
    fn mode(row: LlamaRow) -> Option<bool> {
        Some(row.gemm4)
    }
    fn aux(a: &[BlockQ8K]) -> Vec<[i32; 4]> {
        pair_bsums(a)
    }
    unsafe fn repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Panel]) {
        repack(w, row_bytes, rows, nb, out)
    }
    unsafe fn tile(mode: bool, nr: usize, p: *const Panel, nb: usize, a: *const BlockQ8K, aux: *const [i32; 4], out: *mut f32, out_stride: usize, cols: usize) {
        tile_n(mode, nr, p, nb, a, aux, out, out_stride, cols)
    }
}
