//! RMSNorm (Zhang & Sennrich 2019) as ggml's CPU `rms_norm` + `mul`: the squares are f32 products
//! accumulated in f64 (`ggml_float`), `mean` is rounded to f32, `scale = 1/sqrtf(mean + eps)` in
//! f32, then `out = (x · scale) · w`.

use rayon::prelude::*;

/// `out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · w` for `n_rows` rows of `w.len()`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, n_rows: usize, out: &mut [f32]) {
    let dim = w.len();
    let one = |(o, xr): (&mut [f32], &[f32])| {
        let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &xv), &wv) in o.iter_mut().zip(xr).zip(w) {
            *o = (xv * scale) * wv;
        }
    };
    let (out, x) = (&mut out[..n_rows * dim], &x[..n_rows * dim]);
    if n_rows >= 8 {
        out.par_chunks_mut(dim).zip(x.par_chunks(dim)).for_each(one);
    } else {
        out.chunks_mut(dim).zip(x.chunks(dim)).for_each(one);
    }
}

/// [`rmsnorm`] in place: each of `n_rows` rows of `w.len()` elements of `x` replaced by its norm.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32, n_rows: usize) {
    let dim = w.len();
    let one = |xr: &mut [f32]| {
        let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (xv, &wv) in xr.iter_mut().zip(w) {
            *xv = (*xv * scale) * wv;
        }
    };
    let x = &mut x[..n_rows * dim];
    if n_rows >= 8 {
        x.par_chunks_mut(dim).for_each(one);
    } else {
        x.chunks_mut(dim).for_each(one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_definition() {
        let dim = 37;
        let n_rows = 11;
        let x: Vec<f32> = (0..n_rows * dim)
            .map(|i| ((i * 31) % 17) as f32 - 8.5)
            .collect();
        let w: Vec<f32> = (0..dim).map(|i| 0.5 + i as f32 / dim as f32).collect();
        let mut out = vec![0f32; n_rows * dim];
        rmsnorm(&x, &w, 1e-6, n_rows, &mut out);
        for r in 0..n_rows {
            let row = &x[r * dim..(r + 1) * dim];
            let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
            for i in 0..dim {
                let want = row[i] as f64 / (ms + 1e-6).sqrt() * w[i] as f64;
                assert!((out[r * dim + i] as f64 - want).abs() < 1e-5 * want.abs().max(1.0));
            }
        }
    }

    #[test]
    fn zero_row_stays_finite() {
        let w = vec![1.0f32; 8];
        let mut out = vec![f32::NAN; 8];
        rmsnorm(&[0.0; 8], &w, 1e-5, 1, &mut out);
        assert!(out.iter().all(|v| *v == 0.0));
    }
}
