//! The Gated DeltaNet layer of the Qwen3.5/3.6 hybrids on the CPU, as llama.cpp's CPU backend
//! computes `llama_model_qwen35::graph::build_layer_attn_linear` with the fused
//! `ggml_gated_delta_net` op (`cparams.fused_gdn_ar` / `fused_gdn_ch`, on by default; ggml-cpu
//! `ops.cpp` `ggml_compute_forward_gated_delta_net_one_chunk`):
//!
//! 1. `qkv = h·W_qkv`, `z = h·W_gate`, `β = sigmoid(h·W_β)` (`1/(1 + expf(−x))`),
//!    `g = softplus(h·W_α + dt_bias)·a` (`softplus(x) = x > 20 ? x : logf(1 + expf(x))`);
//! 2. per sequence, the causal depthwise convolution over `[conv state | qkv]` per channel
//!    (`ggml_ssm_conv`: `Σ_j x[t + j]·w[j]` in f32, taps in order), its last `d_conv − 1`
//!    inputs kept as the new conv state, then SiLU (`ggml_vec_silu_f32`: `ggml_v_expf` in groups of
//!    16, `expf` for the rest);
//! 3. q, k (`n_k_heads` heads) L2-normalized as `rms_norm(x, eps/n)·(1/√n)`; value head `i` reads
//!    q/k head `i mod n_k_heads`;
//! 4. per value head and token, on the state `M` (stored transposed: `M[j·d + i] = S[i][j]`):
//!    `M ·= expf(g)`; `δ_j = (v_j − M_j·k)·β`; `M_j += k·δ_j` (FMA); `o_j = (M_j·q)/√d`, the dot
//!    products as `ggml_vec_dot_f32`;
//! 5. `rms_norm(o)·w_norm ⊙ silu(z)` per head, then `·W_out`.
//!
//! Each sequence starts from zeros when its first row is position 0, else from its slot of the
//! cache's recurrent state, and leaves its state after its last row there.

use rayon::prelude::*;

use super::matmul::dot_f32_ggml;
use super::vecops::{expf_ggml, sigmoid, silu};
use super::{CpuBackend, CpuBatch, CpuBuffer, CpuKvCache, CpuWeight};
use crate::backend::{Backend, DeltaNetParams, DeltaNetWeights};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// SiLU of a row in place as `ggml_vec_silu_f32` (AVX-512 build): `x / (1 + ggml_v_expf(−x))`
/// over whole groups of 16, `x / (1 + expf(−x))` for the rest.
pub fn silu_row(x: &mut [f32]) {
    let full = x.len() / 16 * 16;
    for v in &mut x[..full] {
        *v /= 1.0 + expf_ggml(-*v);
    }
    for v in &mut x[full..] {
        *v = silu(*v);
    }
}

/// RMSNorm of one row in place, times `w` when given (ggml `rms_norm`, then `mul`).
fn rms_row(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    match w {
        Some(w) => x.iter_mut().zip(w).for_each(|(v, &wv)| *v = (*v * scale) * wv),
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
}

/// The f32 values of a weight (1-D weights are widened at load; 2-D F32 blocks are f32 already;
/// other formats are dequantized here).
fn f32_values(w: &CpuWeight) -> Result<std::borrow::Cow<'_, [f32]>> {
    if let Some(v) = w.as_f32() {
        return Ok(std::borrow::Cow::Borrowed(v));
    }
    let b = w.bytes();
    if w.wtype == GgmlType::F32 && b.as_ptr().align_offset(4) == 0 {
        // SAFETY: 4-byte aligned F32 data of whole floats; any bit pattern is an f32.
        return Ok(std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len() / 4) }));
    }
    let n: usize = w.dims.iter().product();
    let mut v = vec![0f32; n];
    crate::quant::dequantize_row(w.wtype, b, &mut v).map_err(|e| FakError::model(format!("tensor {}: {e}", w.name)))?;
    Ok(std::borrow::Cow::Owned(v))
}

/// One Gated DeltaNet layer over the batch (see the module doc); `out` gets `[n, n_embd]`.
#[allow(clippy::too_many_arguments)]
pub fn delta_net(be: &CpuBackend, w: &DeltaNetWeights<'_, CpuWeight>, p: &DeltaNetParams, h: &CpuBuffer, cache: &mut CpuKvCache, batch: &CpuBatch, n: usize, out: &mut CpuBuffer) -> Result<()> {
    let (cd, vd, nv, nk, ds, dc) = (p.conv_dim(), p.value_dim(), p.n_v_heads, p.n_k_heads, p.d_state, p.d_conv);
    let state_len = (dc - 1) * cd + nv * ds * ds;
    if cache.layout.state_len != state_len || p.state_layer >= cache.layout.state_layers {
        return Err(FakError::invalid("delta_net", format!("state layer {} of {} ({} values) for a layer of {state_len}", p.state_layer, cache.layout.state_layers, cache.layout.state_len)));
    }
    let buf = |len: usize| -> Result<CpuBuffer> { Ok(CpuBuffer(super::zeroed_vec(len, "delta net scratch")?)) };
    let (mut qkv, mut z, mut beta, mut alpha) = (buf(n * cd)?, buf(n * vd)?, buf(n * nv)?, buf(n * nv)?);
    be.matmul(w.qkv, None, h, n, &mut qkv)?;
    be.matmul(w.gate, None, h, n, &mut z)?;
    be.matmul(w.beta, None, h, n, &mut beta)?;
    be.matmul(w.alpha, None, h, n, &mut alpha)?;
    let (dt, a) = (f32_values(w.dt_bias)?, f32_values(w.a)?);
    let conv_w = f32_values(w.conv)?;
    let norm_w = f32_values(w.norm)?;
    if conv_w.len() != dc * cd || dt.len() != nv || a.len() != nv || norm_w.len() != ds {
        return Err(FakError::model("Gated DeltaNet tensors do not match the layer's shape".to_string()));
    }
    for b in beta.0.iter_mut() {
        *b = sigmoid(*b);
    }
    // g = softplus(alpha + dt_bias) · a
    for row in alpha.0.chunks_mut(nv).take(n) {
        for ((g, &d), &av) in row.iter_mut().zip(dt.iter()).zip(a.iter()) {
            let x = *g + d;
            let sp = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
            *g = sp * av;
        }
    }
    let mut core = buf(n * vd)?;
    let scale = 1.0 / (ds as f32).sqrt();
    let l2_eps = p.eps / ds as f32;
    let l2_scale = 1.0 / (ds as f32).sqrt();
    for s in &batch.plan.seqs {
        let (r0, nr) = (s.row0 as usize, s.n_rows as usize);
        if nr == 0 {
            continue;
        }
        let state = cache.state_mut(p.state_layer, s.state_slot as usize);
        if s.n_past == 0 {
            state.fill(0.0);
        }
        let (conv_state, ssm) = state.split_at_mut((dc - 1) * cd);
        // The convolution, per channel over [conv state | the rows' qkv], then its new state.
        let mut conv = vec![0f32; nr * cd];
        {
            let xin = &qkv.0[r0 * cd..(r0 + nr) * cd];
            let mut input = vec![0f32; dc - 1 + nr];
            for c in 0..cd {
                input[..dc - 1].copy_from_slice(&conv_state[c * (dc - 1)..(c + 1) * (dc - 1)]);
                for t in 0..nr {
                    input[dc - 1 + t] = xin[t * cd + c];
                }
                let wc = &conv_w[c * dc..(c + 1) * dc];
                for t in 0..nr {
                    let mut sum = 0f32;
                    for j in 0..dc {
                        sum = input[t + j].mul_add(wc[j], sum);
                    }
                    conv[t * cd + c] = sum;
                }
                conv_state[c * (dc - 1)..(c + 1) * (dc - 1)].copy_from_slice(&input[nr..nr + dc - 1]);
            }
        }
        for row in conv.chunks_mut(cd) {
            silu_row(row);
            // q and k heads L2-normalized: rms_norm(x, eps/n) · 1/√n
            for head in row[..2 * nk * ds].chunks_mut(ds) {
                rms_row(head, None, l2_eps);
                head.iter_mut().for_each(|v| *v *= l2_scale);
            }
        }
        // The recurrence, one value head per task.
        let gs = &alpha.0[r0 * nv..(r0 + nr) * nv];
        let bs = &beta.0[r0 * nv..(r0 + nr) * nv];
        let core_rows = &mut core.0[r0 * vd..(r0 + nr) * vd];
        let mut per_head: Vec<Vec<f32>> = vec![Vec::new(); nv];
        ssm.par_chunks_mut(ds * ds).zip(per_head.par_iter_mut()).enumerate().for_each(|(iv, (m, o))| {
            let ik = iv % nk;
            o.resize(nr * ds, 0.0);
            let mut delta = vec![0f32; ds];
            for t in 0..nr {
                let row = &conv[t * cd..(t + 1) * cd];
                let q = &row[ik * ds..(ik + 1) * ds];
                let k = &row[nk * ds + ik * ds..nk * ds + (ik + 1) * ds];
                let v = &row[2 * nk * ds + iv * ds..2 * nk * ds + (iv + 1) * ds];
                let decay = gs[t * nv + iv].exp();
                m.iter_mut().for_each(|x| *x *= decay);
                let b = bs[t * nv + iv];
                for (j, dj) in delta.iter_mut().enumerate() {
                    let sum = dot_f32_ggml(&m[j * ds..(j + 1) * ds], k);
                    *dj = (v[j] - sum) * b;
                }
                for (j, &dj) in delta.iter().enumerate() {
                    for (mi, &ki) in m[j * ds..(j + 1) * ds].iter_mut().zip(k) {
                        *mi = ki.mul_add(dj, *mi);
                    }
                }
                for j in 0..ds {
                    o[t * ds + j] = dot_f32_ggml(&m[j * ds..(j + 1) * ds], q) * scale;
                }
            }
        });
        for (iv, o) in per_head.iter().enumerate() {
            for t in 0..nr {
                core_rows[t * vd + iv * ds..t * vd + (iv + 1) * ds].copy_from_slice(&o[t * ds..(t + 1) * ds]);
            }
        }
    }
    // rms_norm(o)·w_norm ⊙ silu(z), per head
    for (orow, zrow) in core.0.chunks_mut(vd).zip(z.0.chunks_mut(vd)).take(n) {
        silu_row(zrow);
        for (oh, zh) in orow.chunks_mut(ds).zip(zrow.chunks(ds)) {
            rms_row(oh, Some(&norm_w), p.eps);
            oh.iter_mut().zip(zh).for_each(|(x, &g)| *x *= g);
        }
    }
    be.matmul(w.out, None, &core, n, out)
}

/// Gated attention's query/gate split: `qg` `[n, n_head, 2·head_dim]` → `q`, `gate`
/// `[n, n_head·head_dim]`.
pub fn split_q_gate(qg: &[f32], n: usize, n_head: usize, head_dim: usize, q: &mut [f32], gate: &mut [f32]) {
    for r in 0..n {
        for hh in 0..n_head {
            let src = &qg[(r * n_head + hh) * 2 * head_dim..];
            let dst = (r * n_head + hh) * head_dim;
            q[dst..dst + head_dim].copy_from_slice(&src[..head_dim]);
            gate[dst..dst + head_dim].copy_from_slice(&src[head_dim..2 * head_dim]);
        }
    }
}

/// `x[i] *= sigmoid(gate[i])` (ggml `sigmoid`: `1/(1 + expf(−g))`, then `mul`).
pub fn mul_sigmoid(x: &mut [f32], gate: &[f32]) {
    for (v, &g) in x.iter_mut().zip(gate) {
        *v *= sigmoid(g);
    }
}
