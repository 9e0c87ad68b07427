// Rotary position embedding (Su et al. 2021) computed as ggml's CPU rope_f32 (and fak's CPU
// backend): pair i's angle starts at θ = p and is multiplied by θ_scale = base^(−2/n_rot) once per
// pair in f32 (θ_scale comes from the host, rounded as the CPU rounds it), divided by the pair's
// frequency factor when given, times freq_scale; cos/sin in f32. NORM rotates (2i, 2i+1), NEOX
// (i, i + n_rot/2); dimensions n_rot..head_dim pass through.
//
// Scaling (ggml rope_yarn; fak's rust/src/backend/cpu/rope.rs yarn_cos_sin): with ext_factor ≠ 0
// (YaRN, Peng et al. 2023) the angle mixes the interpolated θ_i = freq_scale·θ_e and the
// extrapolated θ_e by a ramp over the correction dimensions [corr_lo, corr_hi]:
// mix = (1 − clamp((i − lo)/max(0.001, hi − lo), 0, 1))·ext_factor, θ = fma(θ_i, 1 − mix, θ_e·mix);
// cos/sin are multiplied by mscale, computed on the host exactly as the CPU computes it (1 without
// scaling, so the unscaled path is unchanged).
#include "common.cuh"

// RoPE scaling of one launch (see the header).
struct RopeScale {
    float freq_scale, ext_factor, mscale, corr_lo, corr_hi;
};

// cs[2i], cs[2i + 1] = cos, sin of pair i's angle at position `pos`, i < half; the caller's
// threads all call it (it ends with __syncthreads).
FAK_DEVICE void rope_table(float* cs, float pos, const float* __restrict__ freq_factors, int half, float theta_scale, const RopeScale sc) {
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = pos;
        for (int j = 0; j < i; ++j) theta *= theta_scale;
        const float ff = freq_factors ? freq_factors[i] : 1.0f;
        const float theta_extrap = theta / ff;
        float t = __fmul_rn(sc.freq_scale, theta_extrap);
        if (sc.ext_factor != 0.0f) {
            const float y = __fdiv_rn(__fsub_rn((float)i, sc.corr_lo), fmaxf(0.001f, __fsub_rn(sc.corr_hi, sc.corr_lo)));
            const float mix = __fmul_rn(__fsub_rn(1.0f, fminf(1.0f, fmaxf(0.0f, y))), sc.ext_factor);
            t = fmaf(t, __fsub_rn(1.0f, mix), __fmul_rn(theta_extrap, mix));
        }
        float s, c;
        sincosf(t, &s, &c);
        cs[2 * i] = __fmul_rn(c, sc.mscale);
        cs[2 * i + 1] = __fmul_rn(s, sc.mscale);
    }
    __syncthreads();
}

// Rotates pair i of one head `hx` in place; a, b: the pair's dimensions, y0, y1: the new values.
FAK_DEVICE void rope_pair(float* hx, int i, int half, int neox, const float* cs, int& a, int& b, float& y0, float& y1) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    a = neox ? i : 2 * i;
    b = neox ? i + half : 2 * i + 1;
    const float x0 = hx[a], x1 = hx[b];
    y0 = x0 * c - x1 * s;
    y1 = x0 * s + x1 * c;
    hx[a] = y0;
    hx[b] = y1;
}

// Every pair of every head of one row [n_heads, head_dim], the block's threads striding.
FAK_DEVICE void rope_rows(float* xr, int n_heads, int head_dim, int half, int neox, const float* cs) {
    for (int w = threadIdx.x; w < n_heads * half; w += blockDim.x) {
        const int h = w / half, i = w - h * half;
        int a, b;
        float y0, y1;
        rope_pair(xr + (size_t)h * head_dim, i, half, neox, cs, a, b, y0, y1);
    }
}

// x: [n_rows, n_heads, head_dim] in place; positions: [n_rows]. One block per row.
extern "C" __global__ void rope_f32(float* __restrict__ x, const u32* __restrict__ positions, const float* __restrict__ freq_factors,
                                    int n_heads, int head_dim, int n_rot, float theta_scale, float freq_scale, int neox,
                                    float ext_factor, float mscale, float corr_lo, float corr_hi) {
    pdl_enter();
    extern __shared__ float cs[];  // [n_rot/2][2]
    const int half = n_rot / 2;
    const size_t r = blockIdx.x;
    rope_table(cs, (float)positions[r], freq_factors, half, theta_scale, RopeScale{freq_scale, ext_factor, mscale, corr_lo, corr_hi});
    rope_rows(x + r * (size_t)n_heads * head_dim, n_heads, head_dim, half, neox, cs);
}

// RMSNorm in place of each of the `n_heads` heads of one row (Qwen3's per-head Q/K norm, as the
// CPU's rmsnorm: squares summed in f64, mean rounded to f32, scale = 1/sqrtf(mean + eps), then
// (x·scale)·w): warp w takes heads w, w + nwarps, ...; ends with __syncthreads.
FAK_DEVICE void head_norms(float* xr, const float* __restrict__ w, int n_heads, int head_dim, float eps) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int h = warp; h < n_heads; h += nw) {
        float* hx = xr + (size_t)h * head_dim;
        double ss = 0.0;
        for (int d = lane; d < head_dim; d += 32) ss += (double)(hx[d] * hx[d]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float mean = (float)(ss / (double)head_dim);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int d = lane; d < head_dim; d += 32) hx[d] = __fmul_rn(__fmul_rn(hx[d], scale), w[d]);
    }
    __syncthreads();
}

// The attention block's RoPE of q and k and the KV write, in one launch: q ([n_rows, n_head,
// head_dim]) and k ([n_rows, n_head_kv, head_dim]) rotated in place exactly as rope_f32, then the
// rotated k and v rounded to f16 into each row's slot of the paged cache (layout as kv_write_f16:
// [block][kv_head][slot][head_dim]). One block per row.
extern "C" __global__ void rope_qk_kv_write_f32(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                                                const u32* __restrict__ positions, const u32* __restrict__ slots,
                                                const float* __restrict__ freq_factors, u16* __restrict__ kc, u16* __restrict__ vc,
                                                int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, float freq_scale,
                                                int neox, int block_size, float ext_factor, float mscale, float corr_lo, float corr_hi,
                                                const float* __restrict__ q_norm, const float* __restrict__ k_norm, float norm_eps) {
    pdl_enter();
    extern __shared__ float cs[];  // [n_rot/2][2]
    const int half = n_rot / 2;
    const size_t r = blockIdx.x;
    if (q_norm) {  // Qwen3: each head of q and k RMS-normalized before RoPE
        head_norms(q + r * (size_t)n_head * head_dim, q_norm, n_head, head_dim, norm_eps);
        head_norms(k + r * (size_t)n_head_kv * head_dim, k_norm, n_head_kv, head_dim, norm_eps);
    }
    rope_table(cs, (float)positions[r], freq_factors, half, theta_scale, RopeScale{freq_scale, ext_factor, mscale, corr_lo, corr_hi});
    rope_rows(q + r * (size_t)n_head * head_dim, n_head, head_dim, half, neox, cs);
    const u32 slot = slots[r];
    const u32 blk = slot / block_size, off = slot - blk * block_size;
    const size_t kvw = (size_t)n_head_kv * head_dim;
    float* kr = k + r * kvw;
    const float* vr = v + r * kvw;
    for (int w = threadIdx.x; w < n_head_kv * half; w += blockDim.x) {
        const int h = w / half, i = w - h * half;
        int a, b;
        float y0, y1;
        rope_pair(kr + (size_t)h * head_dim, i, half, neox, cs, a, b, y0, y1);
        const size_t base = (((size_t)blk * n_head_kv + h) * block_size + off) * head_dim;
        kc[base + a] = f32_to_f16(y0);
        kc[base + b] = f32_to_f16(y1);
    }
    const int pass = head_dim - n_rot;  // dimensions RoPE leaves alone
    for (int e = threadIdx.x; e < n_head_kv * pass; e += blockDim.x) {
        const int h = e / pass, d = n_rot + (e - h * pass);
        kc[(((size_t)blk * n_head_kv + h) * block_size + off) * head_dim + d] = f32_to_f16(kr[(size_t)h * head_dim + d]);
    }
    for (int e = threadIdx.x; e < n_head_kv * head_dim; e += blockDim.x) {
        const int h = e / head_dim, d = e - h * head_dim;
        vc[(((size_t)blk * n_head_kv + h) * block_size + off) * head_dim + d] = f32_to_f16(vr[e]);
    }
}
