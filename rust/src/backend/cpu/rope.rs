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
            let t = rope.freq_scale * (theta / ff);
            row[2 * i] = t.cos();
            row[2 * i + 1] = t.sin();
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
            let t = pos as f64 * inv * rope.freq_scale as f64 / ff.map_or(1.0, |f| f[i] as f64);
            let (a, b) = match rope.style {
                RopeStyle::Norm => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (x[a] as f64, x[b] as f64);
            out[a] = x0 * t.cos() - x1 * t.sin();
            out[b] = x0 * t.sin() + x1 * t.cos();
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
        let rope = RopeParams {
            style,
            n_rot,
            freq_base: 10000.0,
            freq_scale,
        };
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
        let rope_n = RopeParams {
            style: RopeStyle::Norm,
            n_rot: 8,
            freq_base: 10000.0,
            freq_scale: 1.0,
        };
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
}
