//! Rotary position embedding (Su et al. 2021, RoFormer), computed as ggml's CPU `rope_f32` does:
//! the angle of pair `i` starts at `θ = p` and is multiplied by `θ_scale = base^(−2/n_rot)` once
//! per pair in f32 (`ggml_rope_cache_init`), divided by the pair's frequency factor when a
//! `rope_freqs` tensor exists, scaled by `freq_scale` (linear scaling), and `cos`/`sin` are taken
//! in f32 — so angles round exactly as llama.cpp's do. The rotation is ggml's `rotate_pairs` as
//! GCC contracts it in llama.cpp's x86 build: `x0·c − x1·s = fma(x0, c, −(x1·s))` and
//! `x0·s + x1·c = fma(x0, s, x1·c)` (bit-identical to llama.cpp's `Qcur`/`Kcur` after RoPE).
//!
//! Pairing: [`RopeStyle::Norm`] rotates `(2i, 2i+1)` (llama.cpp `LLAMA_ROPE_TYPE_NORM`, used for
//! `llama`: its GGUF converter permutes Q/K rows to match), [`RopeStyle::Neox`] rotates
//! `(i, i + n_rot/2)` (`LLAMA_ROPE_TYPE_NEOX`, used for `qwen2`). Dimensions `n_rot..head_dim`
//! pass through unchanged.

use rayon::prelude::*;

use crate::backend::{RopeParams, RopeStyle};

/// `[n_positions, n_rot/2, 2]` table of `(cos θ, sin θ)` for `positions`.
pub fn cos_sin_table(
    positions: &[u32],
    rope: &RopeParams,
    freq_factors: Option<&[f32]>,
) -> Vec<f32> {
    let half = rope.n_rot / 2;
    let theta_scale = rope.freq_base.powf(-2.0 / rope.n_rot as f32);
    let mut table = vec![0f32; positions.len() * half * 2];
    let fill = |(row, &pos): (&mut [f32], &u32)| {
        let mut theta = pos as f32;
        for i in 0..half {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let (c, s) = yarn_cos_sin(theta / ff, i, rope);
            row[2 * i] = c;
            row[2 * i + 1] = s;
            theta *= theta_scale;
        }
    };
    if positions.len() >= 64 {
        table
            .par_chunks_mut(half * 2)
            .zip(positions.par_iter())
            .for_each(fill);
    } else {
        table
            .chunks_mut(half * 2)
            .zip(positions.iter())
            .for_each(fill);
    }
    table
}

/// `(cos θ, sin θ)` of pair `i` from its extrapolated angle `theta_extrap` (`p·θ_scale^i / f_i`),
/// as ggml's `rope_yarn` rounds it in llama.cpp's x86 build (GCC contracts `a·b + c·d` to
/// `fma(a, b, c·d)`): `θ = fma(θ_i, 1 − mix, θ_e·mix)` and `mscale = attn_factor ·
/// fma(0.1, ln(1/freq_scale), 1)` with YaRN; `θ = freq_scale·θ_e` and `mscale = attn_factor`
/// without (bit-identical to the unscaled angle when `freq_scale = attn_factor = 1`).
#[inline]
pub fn yarn_cos_sin(theta_extrap: f32, i: usize, rope: &RopeParams) -> (f32, f32) {
    let theta_interp = rope.freq_scale * theta_extrap;
    let mut theta = theta_interp;
    if rope.ext_factor != 0.0 {
        let [lo, hi] = rope.corr_dims;
        // ggml passes the dimension index i0 = 2i and ramps over i0/2.
        let y = (i as f32 - lo) / (hi - lo).max(0.001);
        let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * rope.ext_factor;
        theta = theta_interp.mul_add(1.0 - ramp_mix, theta_extrap * ramp_mix);
    }
    let mscale = mscale(rope);
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// The magnitude `cos`/`sin` are multiplied by: `attn_factor`, times `fma(0.1, ln(1/freq_scale),
/// 1)` with YaRN (ggml `rope_yarn`). The CUDA kernels take it from here.
pub fn mscale(rope: &RopeParams) -> f32 {
    if rope.ext_factor != 0.0 {
        rope.attn_factor * 0.1f32.mul_add((1.0 / rope.freq_scale).ln(), 1.0)
    } else {
        rope.attn_factor
    }
}

/// Rotates `x` (`[n_rows, n_heads, head_dim]`) in place with the row's entry of `table`
/// (from [`cos_sin_table`]).
pub fn apply(
    x: &mut [f32],
    table: &[f32],
    n_rows: usize,
    n_heads: usize,
    head_dim: usize,
    rope: &RopeParams,
) {
    let half = rope.n_rot / 2;
    let width = n_heads * head_dim;
    let rotate_row = |(row, cs): (&mut [f32], &[f32])| {
        for head in row.chunks_exact_mut(head_dim) {
            match rope.style {
                RopeStyle::Norm => {
                    for i in 0..half {
                        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
                        let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = x0.mul_add(c, -(x1 * s));
                        head[2 * i + 1] = x0.mul_add(s, x1 * c);
                    }
                }
                RopeStyle::Neox => {
                    for i in 0..half {
                        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
                        let (x0, x1) = (head[i], head[i + half]);
                        head[i] = x0.mul_add(c, -(x1 * s));
                        head[i + half] = x0.mul_add(s, x1 * c);
                    }
                }
            }
        }
    };
    let rows = &mut x[..n_rows * width];
    if n_rows >= 32 {
        rows.par_chunks_mut(width)
            .zip(table.par_chunks(half * 2))
            .for_each(rotate_row);
    } else {
        rows.chunks_mut(width)
            .zip(table.chunks(half * 2))
            .for_each(rotate_row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 reference with exact angles `p · base^(−2i/n_rot) · freq_scale / ff_i`.
    fn reference(
        x: &[f32],
        pos: u32,
        head_dim: usize,
        rope: &RopeParams,
        ff: Option<&[f32]>,
    ) -> Vec<f64> {
        let half = rope.n_rot / 2;
        let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for i in 0..half {
            let inv = (rope.freq_base as f64).powf(-2.0 * i as f64 / rope.n_rot as f64);
            let te = pos as f64 * inv / ff.map_or(1.0, |f| f[i] as f64);
            let ti = te * rope.freq_scale as f64;
            let (mut t, mut m) = (ti, rope.attn_factor as f64);
            if rope.ext_factor != 0.0 {
                let [lo, hi] = rope.corr_dims.map(|d| d as f64);
                let y = (i as f64 - lo) / (hi - lo).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * rope.ext_factor as f64;
                t = ti * (1.0 - mix) + te * mix;
                m *= 1.0 + 0.1 * (1.0 / rope.freq_scale as f64).ln();
            }
            let (a, b) = match rope.style {
                RopeStyle::Norm => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (x[a] as f64, x[b] as f64);
            out[a] = m * (x0 * t.cos() - x1 * t.sin());
            out[b] = m * (x0 * t.sin() + x1 * t.cos());
        }
        assert!(head_dim >= rope.n_rot);
        out
    }

    fn check(
        style: RopeStyle,
        n_rot: usize,
        head_dim: usize,
        freq_scale: f32,
        ff: Option<Vec<f32>>,
    ) {
        check_params(RopeParams::linear(style, n_rot, 10000.0, freq_scale), head_dim, ff);
    }

    fn check_params(rope: RopeParams, head_dim: usize, ff: Option<Vec<f32>>) {
        let (style, n_rot) = (rope.style, rope.n_rot);
        let positions: Vec<u32> = vec![0, 1, 7, 100, 513];
        let n_heads = 3;
        let x0: Vec<f32> = (0..positions.len() * n_heads * head_dim)
            .map(|i| ((i * 7919) % 113) as f32 / 56.0 - 1.0)
            .collect();
        let mut x = x0.clone();
        let table = cos_sin_table(&positions, &rope, ff.as_deref());
        apply(&mut x, &table, positions.len(), n_heads, head_dim, &rope);
        for (r, &p) in positions.iter().enumerate() {
            for h in 0..n_heads {
                let o = (r * n_heads + h) * head_dim;
                let want = reference(&x0[o..o + head_dim], p, head_dim, &rope, ff.as_deref());
                for d in 0..head_dim {
                    // f32 angle accumulation (as ggml) costs ~1e-7·p·n_rot/2 radians.
                    let tol = 1e-5 + 2e-7 * p as f64 * n_rot as f64;
                    assert!(
                        (x[o + d] as f64 - want[d]).abs() <= tol,
                        "{style:?} pos {p} head {h} dim {d}: {} vs {}",
                        x[o + d],
                        want[d]
                    );
                }
            }
        }
    }

    #[test]
    fn neox_pairs_halves() {
        check(RopeStyle::Neox, 64, 64, 1.0, None);
    }

    #[test]
    fn norm_pairs_adjacent() {
        check(RopeStyle::Norm, 64, 64, 1.0, None);
    }

    #[test]
    fn partial_rotation_linear_scaling_and_freq_factors() {
        check(
            RopeStyle::Norm,
            32,
            48,
            0.25,
            Some((0..16).map(|i| 1.0 + i as f32 * 0.5).collect()),
        );
        check(RopeStyle::Neox, 16, 24, 0.5, None);
    }

    #[test]
    fn styles_differ_and_position_zero_is_identity() {
        let rope_n = RopeParams::plain(RopeStyle::Norm, 8, 10000.0);
        let rope_x = RopeParams {
            style: RopeStyle::Neox,
            ..rope_n
        };
        let x0: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let (mut a, mut b) = (x0.clone(), x0.clone());
        apply(
            &mut a,
            &cos_sin_table(&[3], &rope_n, None),
            1,
            1,
            8,
            &rope_n,
        );
        apply(
            &mut b,
            &cos_sin_table(&[3], &rope_x, None),
            1,
            1,
            8,
            &rope_x,
        );
        assert!(a.iter().zip(&b).any(|(p, q)| (p - q).abs() > 1e-3));
        let mut z = x0.clone();
        apply(
            &mut z,
            &cos_sin_table(&[0], &rope_n, None),
            1,
            1,
            8,
            &rope_n,
        );
        assert_eq!(z, x0);
    }

    /// YaRN as Qwen2.5's model card sets it for 128k (factor 4 over 32768 trained tokens).
    fn yarn(style: RopeStyle, n_rot: usize, base: f32, factor: f32, n_orig: usize) -> RopeParams {
        let fs = 1.0 / factor;
        RopeParams {
            ext_factor: 1.0,
            attn_factor: 1.0,
            corr_dims: RopeParams::yarn_corr_dims(n_rot, n_orig, base, 32.0, 1.0),
            ..RopeParams::linear(style, n_rot, base, fs)
        }
    }

    #[test]
    fn yarn_against_f64_reference() {
        for style in [RopeStyle::Neox, RopeStyle::Norm] {
            let mut r = yarn(style, 64, 10000.0, 4.0, 4096);
            check_params(r, 64, None);
            r.attn_factor = 0.9;
            check_params(r, 80, Some((0..32).map(|i| 1.0 + i as f32 * 0.25).collect()));
        }
    }

    #[test]
    fn yarn_corr_dims_match_ggml() {
        // Qwen2.5: base 1e6, head_dim 64, 32768 original tokens: d(32) = 64·ln(32768/(64π))/(2 ln 1e6).
        let d = |beta: f64| 64.0 * (32768.0 / (2.0 * std::f64::consts::PI * beta)).ln() / (2.0 * 1e6f64.ln());
        let [lo, hi] = RopeParams::yarn_corr_dims(64, 32768, 1e6, 32.0, 1.0);
        assert_eq!(lo as f64, d(32.0).floor().max(0.0));
        assert_eq!(hi as f64, d(1.0).ceil().min(63.0));
        assert!(lo < hi, "{lo} {hi}");
    }

    #[test]
    fn yarn_low_dims_extrapolate_high_dims_interpolate() {
        // Pairs below lo keep the unscaled angle (times mscale), pairs above hi take the linear one.
        let r = yarn(RopeStyle::Neox, 64, 10000.0, 4.0, 512);
        let [lo, hi] = r.corr_dims;
        let plain = RopeParams::plain(RopeStyle::Neox, 64, 10000.0);
        let lin = RopeParams::linear(RopeStyle::Neox, 64, 10000.0, 0.25);
        let m = 0.1f32.mul_add(4f32.ln(), 1.0);
        let t = cos_sin_table(&[1000], &r, None);
        let tp = cos_sin_table(&[1000], &plain, None);
        let tl = cos_sin_table(&[1000], &lin, None);
        for i in 0..32 {
            let (c, s) = (t[2 * i], t[2 * i + 1]);
            if (i as f32) < lo {
                assert_eq!((c, s), (tp[2 * i] * m, tp[2 * i + 1] * m), "pair {i}");
            } else if (i as f32) >= hi {
                assert_eq!((c, s), (tl[2 * i] * m, tl[2 * i + 1] * m), "pair {i}");
            }
        }
    }

    #[test]
    fn unscaled_angles_are_the_pre_yarn_ones_bit_for_bit() {
        // What cos_sin_table computed before YaRN existed: t = freq_scale · (θ / f_i).
        let ff: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 * 0.5).collect();
        for (scale, ff) in [(1.0, None), (0.25, Some(&ff[..])), (1.0, Some(&ff[..]))] {
            let r = RopeParams::linear(RopeStyle::Neox, 64, 1e6, scale);
            let pos: Vec<u32> = (0..200).map(|p| p * 331).collect();
            let t = cos_sin_table(&pos, &r, ff);
            let ts = r.freq_base.powf(-2.0 / 64.0);
            for (k, &p) in pos.iter().enumerate() {
                let mut theta = p as f32;
                for i in 0..32 {
                    let a = r.freq_scale * (theta / ff.map_or(1.0, |f| f[i]));
                    assert_eq!(t[k * 64 + 2 * i].to_bits(), a.cos().to_bits());
                    assert_eq!(t[k * 64 + 2 * i + 1].to_bits(), a.sin().to_bits());
                    theta *= ts;
                }
            }
        }
    }
}
