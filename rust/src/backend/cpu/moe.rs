//! The mixture-of-experts ops on the CPU, as llama.cpp's CPU backend computes `build_moe_ffn`
//! (llama.cpp `src/llama-graph.cpp`) with softmax gating:
//!
//! - [`route`]: `ggml_soft_max` of the router logits (ggml `ggml_vec_soft_max_f32`, AVX-512
//!   build: `ggml_v_expf` over groups of 16 summed by `_mm512_reduce_add_ps`, libm `expf` for the
//!   rest, the total in f64, then `× (float)(1/total)`), `ggml_argsort_top_k` (libstdc++
//!   `std::sort` of the indices by descending probability: [`super::stdsort`]), `ggml_get_rows` of
//!   the chosen probabilities, their f64 sum rounded to f32 (`ggml_vec_sum_f32`), clamped at
//!   2⁻¹⁴, the division, and the optional scale;
//! - [`ExpertMatmul::run`]: ggml `mul_mat_id`, each (row, chosen expert) pair a product with that
//!   expert's matrix in the kernel llama.cpp's CPU build picks for it (see there);
//! - [`combine`]: `ggml_mul` of each expert's output by its weight, the outputs summed in the
//!   order of the choice (`ggml_add` chain), then added to the residual;
//! - [`localize`]: a tensor-parallel shard's pairs of the experts it holds (the others skipped).

use rayon::prelude::*;

use super::matmul::{self, LlamaRow};
use super::stdsort::std_sort;
use super::vecops::{expf_ggml, reduce16};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// The router of `n_rows` rows: `logits` is `[n_rows, n_expert]`; writes the `k` chosen experts of
/// each row into `ids[r·k ..][..k]` (as f32 values) and their weights into `weights[r·k ..][..k]`.
/// See the module doc for the arithmetic.
#[allow(clippy::too_many_arguments)]
pub fn route(logits: &[f32], n_rows: usize, n_expert: usize, k: usize, norm_w: bool, w_scale: f32, ids: &mut [f32], weights: &mut [f32]) {
    let one = |((row, ids), ws): ((&[f32], &mut [f32]), &mut [f32])| {
        let mut probs = row.to_vec();
        softmax(&mut probs);
        let mut idx: Vec<i32> = (0..n_expert as i32).collect();
        std_sort(&mut idx, &|&a, &b| probs[a as usize] > probs[b as usize]);
        for s in 0..k {
            ids[s] = idx[s] as f32;
            ws[s] = probs[idx[s] as usize];
        }
        if norm_w {
            let sum = ws.iter().map(|&w| w as f64).sum::<f64>() as f32;
            let sum = sum.max(6.103515625e-5);
            ws.iter_mut().for_each(|w| *w /= sum);
        }
        if w_scale != 0.0 && w_scale != 1.0 {
            ws.iter_mut().for_each(|w| *w *= w_scale);
        }
    };
    let rows = logits[..n_rows * n_expert].chunks(n_expert);
    let ids = ids[..n_rows * k].chunks_mut(k);
    let ws = weights[..n_rows * k].chunks_mut(k);
    rows.zip(ids).zip(ws).for_each(one);
}

/// `ggml_soft_max` of one row in place (no mask, scale 1), with the numerics of llama.cpp's
/// AVX-512 CPU build.
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    let full = x.len() / 16 * 16;
    for chunk in x[..full].chunks_exact_mut(16) {
        let mut v = [0f32; 16];
        for (o, e) in v.iter_mut().zip(chunk.iter_mut()) {
            *e = expf_ggml(*e - max);
            *o = *e;
        }
        sum += reduce16(&v) as f64;
    }
    for e in &mut x[full..] {
        *e = (*e - max).exp();
        sum += *e as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|e| *e *= inv);
}

/// Of the chosen experts `ids` (f32 values) and their `weights`, those in `[e0, e1)` become
/// `id − e0`; the others become −1 with weight 0 ([`ExpertMatmul::run`] skips them).
pub fn localize(ids: &mut [f32], weights: &mut [f32], e0: usize, e1: usize) {
    for (id, w) in ids.iter_mut().zip(weights.iter_mut()) {
        let e = *id as usize;
        if (e0..e1).contains(&e) {
            *id = (e - e0) as f32;
        } else {
            *id = -1.0;
            *w = 0.0;
        }
    }
}

/// A stack of `n_expert` matrices of `n_out` rows of `k_in` (GGUF blocks of `wtype`): a MoE
/// layer's `ffn_{gate,up,down}_exps` (`dims = [k_in, n_out, n_expert]`).
pub struct ExpertMatmul<'a> {
    pub wtype: GgmlType,
    pub w: &'a [u8],
    pub k_in: usize,
    pub n_out: usize,
    pub n_expert: usize,
}

/// Rows routed to one expert in one llama.cpp ubatch from which its CPU build takes the tiled
/// K-quant kernel for that expert (ggml-cpu `tiled/tiled.cpp`, `ggml_tiled_min_batch`).
const TILED_MIN_ROUTED: usize = 8;

impl ExpertMatmul<'_> {
    /// Expert `e`'s matrix.
    fn expert(&self, e: usize) -> Result<&[u8]> {
        let rb = self
            .wtype
            .row_bytes(self.k_in as u64)
            .ok_or_else(|| FakError::invalid("k", format!("{} is not a whole number of {} blocks", self.k_in, self.wtype.name())))? as usize;
        self.w
            .get(e * self.n_out * rb..(e + 1) * self.n_out * rb)
            .ok_or_else(|| FakError::invalid("ids", format!("expert {e} is outside the tensor")))
    }

    /// ggml `mul_mat_id` over the `ids.len()` (row, chosen expert) pairs, `k` per row: `out[p, :]
    /// = W_e · x[i, :]` with `e = ids[p]`, `i = p` when `x_per_pair`, else `p / k`.
    ///
    /// Pairs are grouped by expert, each group one matmul. The f32 order of each product is the
    /// kernel llama.cpp's x86 CPU build runs for it: the repacked Q4_K GEMV (every pair is a one-row
    /// product there), `ggml_vec_dot_*` for the other formats — or, for Q6_K, the tiled kernel
    /// when ≥ 8 rows of the pair's llama.cpp ubatch (`groups[row]`, from the CPU backend's
    /// batch; `None`: every row alone) chose the same expert, as `ggml_compute_forward_mul_mat_id`
    /// decides per expert and ubatch.
    ///
    /// A pair with id −1 ([`localize`]: an expert another tensor-parallel shard holds) is left
    /// out: its output row is 0.
    ///
    /// Errors: [`FakError::InvalidArgument`] for an expert id outside `0..n_expert`; matmul errors.
    pub fn run(&self, x: &[f32], x_per_pair: bool, ids: &[f32], k: usize, groups: Option<&[u32]>, out: &mut [f32]) -> Result<()> {
        let (k_in, n_out) = (self.k_in, self.n_out);
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); self.n_expert];
        for (p, &e) in ids.iter().enumerate() {
            if e == -1.0 {
                out[p * n_out..(p + 1) * n_out].fill(0.0);
                continue;
            }
            let e = e as usize;
            if e >= self.n_expert {
                return Err(FakError::invalid("ids", format!("expert id {e} for {} experts", self.n_expert)));
            }
            by_expert[e].push(p);
        }
        let group = |p: usize| groups.map_or(p / k, |g| g[p / k] as usize);
        // k-quant weights: every input row quantized to Q8_K once (a token's row is read by each
        // of its k experts), each expert gathering its rows' blocks (a quarter of the f32 bytes).
        let k_quant = matches!(self.wtype, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K);
        let q8k = if k_quant { Some(matmul::quantize_q8k(x, k_in)?) } else { None };
        let nb = k_in / 256;
        let results: Vec<(usize, Vec<f32>)> = by_expert
            .par_iter()
            .enumerate()
            .filter(|(_, ps)| !ps.is_empty())
            .map(|(e, ps)| -> Result<(usize, Vec<f32>)> {
                let we = self.expert(e)?;
                let kinds = ps.iter().map(|&p| {
                    let g = group(p);
                    let routed = ps.iter().filter(|&&q| group(q) == g).count();
                    LlamaRow { gemm4: false, tiled: routed >= TILED_MIN_ROUTED, single: true }
                });
                let src = |p: usize| if x_per_pair { p } else { p / k };
                let mut y = vec![0f32; ps.len() * n_out];
                if let Some(a) = &q8k {
                    let mut blocks = Vec::with_capacity(ps.len() * nb);
                    for (&p, kind) in ps.iter().zip(kinds) {
                        let i = src(p);
                        blocks.extend(a[i * nb..(i + 1) * nb].iter().map(|b| matmul::BlockQ8K { row: kind, ..*b }));
                    }
                    matmul::matmul_q8k(self.wtype, we, n_out, k_in, &blocks, ps.len(), &mut y)?;
                } else {
                    let mut xs = Vec::with_capacity(ps.len() * k_in);
                    for &p in ps {
                        xs.extend_from_slice(&x[src(p) * k_in..(src(p) + 1) * k_in]);
                    }
                    matmul::matmul_rows(self.wtype, we, n_out, k_in, &xs, ps.len(), &mut y, &kinds.collect::<Vec<_>>())?;
                }
                Ok((e, y))
            })
            .collect::<Result<_>>()?;
        for (e, y) in results {
            for (i, &p) in by_expert[e].iter().enumerate() {
                out[p * n_out..(p + 1) * n_out].copy_from_slice(&y[i * n_out..(i + 1) * n_out]);
            }
        }
        Ok(())
    }
}

/// `res[r, :] += Σ_s weights[r·k + s] · experts[r·k + s, :]` for `n_rows` rows of `dim`: each
/// product rounded to f32, the products summed in slot order, then the sum added to `res`
/// (llama.cpp: `ggml_mul`, the `ggml_add` chain, `ggml_add(moe_out, ffn_inp)`).
pub fn combine(experts: &[f32], weights: &[f32], n_rows: usize, k: usize, dim: usize, res: &mut [f32]) {
    let one = |(r, out): (usize, &mut [f32])| {
        for (i, o) in out.iter_mut().enumerate() {
            let mut acc = experts[(r * k) * dim + i] * weights[r * k];
            for s in 1..k {
                acc += experts[(r * k + s) * dim + i] * weights[r * k + s];
            }
            *o = acc + *o;
        }
    };
    let res = &mut res[..n_rows * dim];
    if n_rows >= 8 {
        res.par_chunks_mut(dim).enumerate().for_each(one);
    } else {
        res.chunks_mut(dim).enumerate().for_each(one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_picks_the_largest_and_normalizes() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 0.3, 1.5, 0.0, -3.0];
        let (mut ids, mut ws) = ([0f32; 3], [0f32; 3]);
        route(&logits, 1, 8, 3, true, 0.0, &mut ids, &mut ws);
        assert_eq!(ids[0], 1.0);
        assert!(ids[1..].contains(&3.0) && ids[1..].contains(&5.0), "{ids:?}");
        assert!((ws.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(ws[0] > ws[1] && ws[1] == ws[2]);
    }

    #[test]
    fn localize_keeps_the_shards_experts_and_zeroes_the_others_weights() {
        let mut ids = [5f32, 1.0, 7.0, 4.0];
        let mut ws = [0.4f32, 0.3, 0.2, 0.1];
        localize(&mut ids, &mut ws, 4, 8);
        assert_eq!((ids, ws), ([1.0, -1.0, 3.0, 0.0], [0.4, 0.0, 0.2, 0.1]));
        // a skipped pair's output row is zero; the others are computed
        let (k_in, n_out) = (32, 2);
        let w: Vec<u8> = (0..4 * n_out).flat_map(|_| f32_row(k_in)).collect();
        let m = ExpertMatmul { wtype: GgmlType::F32, w: &w, k_in, n_out, n_expert: 4 };
        let x = vec![1f32; 2 * k_in];
        let mut out = vec![7f32; 4 * n_out];
        m.run(&x, false, &ids, 2, None, &mut out).unwrap();
        assert_eq!(out[2..4], [0.0, 0.0]);
        assert!(out[..2].iter().chain(&out[4..]).all(|&v| v == k_in as f32), "{out:?}");
    }

    fn f32_row(k: usize) -> Vec<u8> {
        (0..k).flat_map(|_| 1f32.to_le_bytes()).collect()
    }

    #[test]
    fn combine_sums_in_slot_order() {
        let experts = [1.0f32, 2.0, 10.0, 20.0];
        let weights = [0.5f32, 0.25];
        let mut res = [100.0f32, 200.0];
        combine(&experts, &weights, 1, 2, 2, &mut res);
        assert_eq!(res, [100.0 + 0.5 + 2.5, 200.0 + 1.0 + 5.0]);
    }
}
