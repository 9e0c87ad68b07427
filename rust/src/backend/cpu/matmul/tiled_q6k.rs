//! The Q6_K × Q8_K prefill kernel of [`tiled`](super::tiled): 16 weight rows (one per i32 lane of
//! a `zmm`) × up to [`TILE_ROWS`](super::tiled::TILE_ROWS) activation rows, for the rows llama.cpp computes in its tiled
//! K-quant kernel ([`LlamaRow::tiled`]: ubatches of ≥ 8 rows); other rows go to the one-row kernel.
//!
//! The panel holds each row's 6-bit values `u` (0..63, the −32 offset not applied) already
//! assembled from `ql`/`qh`, 4 per dword lane (`[t]`: elements `4t..4t+4`), so the inner loop is
//! loads and `vpdpbusd` only; the 16 signed sub-block scales per lane as i32 and as i16 pairs, and
//! `d` per lane.
//!
//! Exactness: per row and super-block the exact integer total of the one-row kernel (`x86.rs`,
//! `q6k`), `isum = Σ_s sc_s·Σ u·q8 − 32·Σ_s sc_s·bsum_s` (each sub-block's `Σ u·q8` ≤ 16·63·128 in
//! an i32 lane, times its scale by `vpmulld`; the offset term from 8 `vpdpwssd` of the scale pairs
//! and Q8_K's `bsums` pairs), then the same f32 step `out = fma(float(isum)·d, d_x, out)` (ggml-cpu
//! `tiled/tiled-kernel.cpp` as GCC contracts it) — bit-identical to the one-row kernel and to
//! llama.cpp (tests: `tiled_bit_identical`).

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use super::act::{BlockQ8K, LlamaRow};
use super::blocks;
use super::tiled::{TiledFormat, PANEL, TILE_ROWS};
use super::tiled_avx2::{q6_scales8, transpose8, u6_quarter};
use core::arch::x86_64::*;

/// One Q6_K super-block of 16 weight rows, repacked (see the module docs).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Panel {
    /// `[t]`: lane `c` = row `c`'s 6-bit values of elements `4t..4t+4`.
    u: [[u8; 64]; 64],
    /// `[s]`: lane `c` = row `c`'s scale of sub-block `s` (16 elements).
    sc: [[i32; PANEL]; 16],
    /// `[k]`: lane `c` = row `c`'s scales of sub-blocks `2k` (low i16) and `2k + 1` (high i16).
    scp: [[i32; PANEL]; 8],
    d: [f32; PANEL],
}

const ZERO_PANEL: Panel = Panel { u: [[0; 64]; 64], sc: [[0; PANEL]; 16], scp: [[0; PANEL]; 8], d: [0.0; PANEL] };

/// Repacks weight rows `rows` (≤ 16) into `out[..nb]`: the 6-bit values of 8 rows assembled 32 at
/// a time ([`u6_quarter`]) and transposed 4 bytes at a time ([`transpose8`]), the scales likewise
/// ([`q6_scales8`]).
///
/// # Safety
/// AVX2 + F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Panel]) {
    use blocks::q6_k::*;
    for (i, p) in out[..nb].iter_mut().enumerate() {
        if rows < PANEL {
            *p = ZERO_PANEL;
        }
        for h in 0..rows.div_ceil(8) {
            let n = (rows - 8 * h).min(8);
            for k in 0..8 {
                let v = core::array::from_fn(|c| if c < n { u6_quarter(w[(8 * h + c) * row_bytes + i * BYTES..][..BYTES].as_ptr(), k) } else { _mm256_setzero_si256() });
                for (g, t) in transpose8(v).into_iter().enumerate() {
                    _mm256_store_si256(p.u[8 * k + g][32 * h..].as_mut_ptr() as *mut __m256i, t);
                }
            }
            let (t, d) = q6_scales8(|c| w[(8 * h + c) * row_bytes + i * BYTES..][..BYTES].as_ptr(), n);
            for k in 0..8 {
                _mm256_storeu_si256(p.scp[k][8 * h..].as_mut_ptr() as *mut __m256i, t[k]);
                let lo = _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(t[k]));
                _mm256_storeu_si256(p.sc[2 * k][8 * h..].as_mut_ptr() as *mut __m256i, lo);
                _mm256_storeu_si256(p.sc[2 * k + 1][8 * h..].as_mut_ptr() as *mut __m256i, _mm256_srai_epi32::<16>(t[k]));
            }
            _mm256_storeu_ps(p.d[8 * h..].as_mut_ptr(), d);
        }
    }
}

/// `out[r·out_stride + c] = W_row(c) · a_row(r)` for `r < R`, `c < cols`, in the tiled-kernel
/// order (see the module docs).
///
/// # Safety
/// As [`TiledFormat::tile`].
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize>(p: *const Panel, nb: usize, a: *const BlockQ8K, st: usize, out: *mut f32, out_stride: usize, cols: usize) {
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        let pb = &*p.add(i);
        let ys: [*const BlockQ8K; R] = core::array::from_fn(|r| a.add(r * st + i));
        // Σ_s sc_s·bsum_s per row (the −32 offset's factor).
        let mut off = [zero; R];
        for k in 0..8 {
            let scp = _mm512_load_si512(pb.scp[k].as_ptr() as *const _);
            for r in 0..R {
                let bs = ((*ys[r]).bsums.as_ptr().add(2 * k) as *const i32).read_unaligned();
                off[r] = _mm512_dpwssd_epi32(off[r], scp, _mm512_set1_epi32(bs));
            }
        }
        let mut tot = [zero; R];
        for s in 0..16 {
            let mut sub = [zero; R];
            for g in 0..4 {
                let u = _mm512_load_si512(pb.u[4 * s + g].as_ptr() as *const _);
                for r in 0..R {
                    let y = (*ys[r]).qs.as_ptr().add(16 * s + 4 * g) as *const i32;
                    sub[r] = _mm512_dpbusd_epi32(sub[r], u, _mm512_set1_epi32(y.read_unaligned()));
                }
            }
            let sc = _mm512_load_si512(pb.sc[s].as_ptr() as *const _);
            for r in 0..R {
                tot[r] = _mm512_add_epi32(tot[r], _mm512_mullo_epi32(sub[r], sc));
            }
        }
        let d = _mm512_load_ps(pb.d.as_ptr());
        for r in 0..R {
            let isum = _mm512_sub_epi32(tot[r], _mm512_slli_epi32::<5>(off[r]));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), d), _mm512_set1_ps((*ys[r]).d), acc[r]);
        }
    }
    let mask: __mmask16 = if cols >= PANEL { 0xFFFF } else { (1u16 << cols) - 1 };
    for r in 0..R {
        _mm512_mask_storeu_ps(out.add(r * out_stride), mask, acc[r]);
    }
}

/// Q6_K in the tiled driver: rows of llama.cpp's tiled kernel only.
pub(super) struct Q6K;

impl TiledFormat for Q6K {
    type Panel = Panel;
    const ZERO: Panel = ZERO_PANEL;
    const BYTES: usize = blocks::q6_k::BYTES;
    fn mode(row: LlamaRow) -> Option<bool> {
        row.tiled.then_some(true)
    }
    fn aux(_: &[BlockQ8K]) -> Vec<[i32; 4]> {
        Vec::new()
    }
    unsafe fn repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Panel]) {
        repack(w, row_bytes, rows, nb, out)
    }
    unsafe fn tile(_: bool, nr: usize, p: *const Panel, nb: usize, a: *const BlockQ8K, _: *const [i32; 4], out: *mut f32, out_stride: usize, cols: usize) {
        debug_assert!((1..=TILE_ROWS).contains(&nr));
        match nr {
            1 => tile::<1>(p, nb, a, nb, out, out_stride, cols),
            2 => tile::<2>(p, nb, a, nb, out, out_stride, cols),
            3 => tile::<3>(p, nb, a, nb, out, out_stride, cols),
            _ => tile::<4>(p, nb, a, nb, out, out_stride, cols),
        }
    }
}
