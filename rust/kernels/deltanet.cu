// The Gated DeltaNet layer of the Qwen3.5/3.6 hybrids (llama.cpp `qwen35`
// `build_layer_attn_linear` with the fused `ggml_gated_delta_net`; the CPU reference and its order
// of operations: rust/src/backend/cpu/deltanet.rs). The projections run on the quantized matmul
// kernels; this family holds what lies between them:
//
// - gdn_conv_silu_f32: the causal depthwise convolution of each sequence's rows over
//   [conv state | qkv] per channel (ggml_ssm_conv: Σ_j x[t + j]·w[j], taps in order, FMA), SiLU,
//   and the new conv state (the last d_conv − 1 inputs);
// - gdn_recurrence_d<D>: per (sequence, value head), token by token: the L2 norms of q and k
//   (rms_norm(x, eps/D)·(1/√D)), the gates β = sigmoid(β_in), g = softplus(α_in + dt_bias)·a
//   (softplus threshold 20), the delta rule on the state M (M ·= e^g; δ_j = (v_j − M_j·k)·β;
//   M_j += k·δ_j; o_j = M_j·q/√D), then the gated RMSNorm rms_norm(o)·w_norm ⊙ silu(z);
// - gdn_copy_state_f32: one recurrent-state slot copied to another in every state layer.
//
// Recurrent state of one slot (f32, `state_len` values): the conv state `[conv_dim][d_conv − 1]`
// then, per value head, M `[D][D]` with `M[j·D + i] = S[i][j]` (row j: output j), as the CPU.
// A sequence whose first row is position 0 (n_past == 0) starts from zeros, else from its slot;
// its slot holds the state after its last row when the kernel ends.
//
// Batch arrays (backend/cuda/mod.rs `BatchLayout`): `seqs` 5 u32 per sequence (row0, n_rows,
// n_past, table0, n_blocks); `states` the state slot of each sequence.
#include "common.cuh"

#define GDN_MAX_CONV 8

FAK_DEVICE float gdn_silu(float x) { return x / (1.0f + expf(-x)); }

// Causal conv + SiLU. Grid (n_seqs, ⌈conv_dim/128⌉), 128 threads: one thread per channel, each
// sequence's rows in order. `state` points at this state layer's slot 0.
extern "C" __global__ void gdn_conv_silu_f32(const float* __restrict__ qkv, float* __restrict__ out, const float* __restrict__ conv_w,
                                             float* __restrict__ state, const u32* __restrict__ seqs, const u32* __restrict__ states,
                                             int conv_dim, int d_conv, long long state_len) {
    pdl_enter();
    const int s = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    const u32 row0 = seqs[5 * s], n_rows = seqs[5 * s + 1], n_past = seqs[5 * s + 2];
    if (n_rows == 0) return;
    const int nc = d_conv - 1;  // conv state per channel
    float* cs = state + (size_t)states[s] * (size_t)state_len + (size_t)c * nc;
    float w[GDN_MAX_CONV];
    float win[GDN_MAX_CONV];  // the last nc inputs, oldest first
#pragma unroll
    for (int j = 0; j < GDN_MAX_CONV; ++j) {
        w[j] = j < d_conv ? conv_w[(size_t)c * d_conv + j] : 0.0f;
        win[j] = (j < nc && n_past != 0) ? cs[j] : 0.0f;
    }
    for (u32 t = 0; t < n_rows; ++t) {
        const size_t at = (size_t)(row0 + t) * conv_dim + c;
        const float x = qkv[at];
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < GDN_MAX_CONV - 1; ++j)
            if (j < nc) sum = fmaf(win[j], w[j], sum);
        // the newest tap: w[nc], selected without a dynamic register index
        float wl = 0.0f;
#pragma unroll
        for (int j = 0; j < GDN_MAX_CONV; ++j)
            if (j == nc) wl = w[j];
        sum = fmaf(x, wl, sum);
        out[at] = gdn_silu(sum);
#pragma unroll
        for (int j = 0; j < GDN_MAX_CONV - 1; ++j) {
            if (j + 1 < nc) win[j] = win[j + 1];
            else if (j + 1 == nc) win[j] = x;
        }
    }
#pragma unroll
    for (int j = 0; j < GDN_MAX_CONV - 1; ++j)
        if (j < nc) cs[j] = win[j];
}

// Sums of `a` and `b` over the block (blockDim.x a multiple of 32, at most 1024). Every thread
// gets both sums; `red` (32 float2 of shared memory) is free again when it returns.
FAK_DEVICE float2 gdn_block_sum2(float a, float b, float2* red) {
    a = warp_sum(a);
    b = warp_sum(b);
    const int wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) red[wid] = make_float2(a, b);
    __syncthreads();
    float2 r = red[0];
    for (int i = 1; i < nw; ++i) {
        r.x += red[i].x;
        r.y += red[i].y;
    }
    __syncthreads();
    return r;
}

// The recurrence with the L2 norms, the gates and the gated RMSNorm. Grid (n_seqs, n_v_heads),
// max(D·P, 32) threads: row j of the head's state M (j < D) is held in registers by the P
// adjacent threads j·P .. j·P + P − 1, each E = D/P of its values (P a power of 2, at most 32, so
// the P lanes of a row lie in one warp). `conv` is the convolution's output `[n_rows, conv_dim]`
// (q heads, k heads, v heads), `z` `[n_rows, n_v·D]`, `alpha` / `beta` `[n_rows, n_v]`, `out`
// `[n_rows, n_v·D]`. `state` points at this state layer's slot 0; `ssm_off` is the conv state's
// length (the heads' states follow it).
template <int D, int P>
__device__ void gdn_recurrence(const float* __restrict__ conv, const float* __restrict__ z, const float* __restrict__ alpha,
                               const float* __restrict__ beta, const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,
                               const float* __restrict__ norm_w, float* __restrict__ state, const u32* __restrict__ seqs,
                               const u32* __restrict__ states, float* __restrict__ out, int n_k, int n_v, long long ssm_off,
                               long long state_len, float eps) {
    constexpr int E = D / P;
    static_assert(D % P == 0 && E % 4 == 0 && P <= 32 && (P & (P - 1)) == 0, "row split");
    __shared__ __align__(16) float sh_q[D];
    __shared__ __align__(16) float sh_k[D];
    __shared__ float2 red[32];
    pdl_enter();
    const int s = blockIdx.x, iv = blockIdx.y, t = threadIdx.x;
    const int j = t / P, part = t % P;
    const u32 row0 = seqs[5 * s], n_rows = seqs[5 * s + 1], n_past = seqs[5 * s + 2];
    if (n_rows == 0) return;  // the whole block: no barrier is skipped by a part of it
    const int ik = iv % n_k;
    const int conv_dim = (2 * n_k + n_v) * D, vd = n_v * D;
    const bool own = j < D;       // holds a part of row j
    const bool lead = own && part == 0;
    const bool loader = t < D;    // loads q[t], k[t]
    float* mp = state + (size_t)states[s] * (size_t)state_len + (size_t)ssm_off + ((size_t)iv * D + (own ? j : 0)) * D + part * E;
    float m[E];
    if (own && n_past != 0) {
#pragma unroll
        for (int i = 0; i < E; i += 4) {
            const float4 v = *(const float4*)(mp + i);
            m[i] = v.x; m[i + 1] = v.y; m[i + 2] = v.z; m[i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i) m[i] = 0.0f;
    }
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    const float l2_eps = eps / (float)D;
    const float dt = dt_bias[iv], av = ssm_a[iv], wn = own ? norm_w[j] : 0.0f;
    const float* kq = sh_q + part * E;
    const float* kk = sh_k + part * E;
    for (u32 r = 0; r < n_rows; ++r) {
        const size_t row = row0 + r;
        const float* x = conv + row * conv_dim;
        const float qi = loader ? x[ik * D + t] : 0.0f;
        const float ki = loader ? x[n_k * D + ik * D + t] : 0.0f;
        const float vj = own ? x[2 * n_k * D + iv * D + j] : 0.0f;
        const float2 ss = gdn_block_sum2(qi * qi, ki * ki, red);
        const float qs = 1.0f / sqrtf(ss.x / (float)D + l2_eps), ks = 1.0f / sqrtf(ss.y / (float)D + l2_eps);
        if (loader) {
            sh_q[t] = (qi * qs) * inv_sqrt_d;
            sh_k[t] = (ki * ks) * inv_sqrt_d;
        }
        __syncthreads();
        // the gates of this (row, head): β = sigmoid, g = softplus(α + dt_bias)·a
        const float b = 1.0f / (1.0f + expf(-beta[row * n_v + iv]));
        const float ax = alpha[row * n_v + iv] + dt;
        const float g = (ax > 20.0f ? ax : logf(1.0f + expf(ax))) * av;
        const float decay = expf(g);
        float dot = 0.0f;
        if (own) {
#pragma unroll
            for (int i = 0; i < E; i += 4) {
                const float4 k4 = *(const float4*)(kk + i);
                m[i] *= decay; m[i + 1] *= decay; m[i + 2] *= decay; m[i + 3] *= decay;
                dot = fmaf(m[i], k4.x, dot);
                dot = fmaf(m[i + 1], k4.y, dot);
                dot = fmaf(m[i + 2], k4.z, dot);
                dot = fmaf(m[i + 3], k4.w, dot);
            }
        }
#pragma unroll
        for (int l = 1; l < P; l <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, l);
        const float delta = (vj - dot) * b;
        float o = 0.0f;
        if (own) {
#pragma unroll
            for (int i = 0; i < E; i += 4) {
                const float4 k4 = *(const float4*)(kk + i);
                const float4 q4 = *(const float4*)(kq + i);
                m[i] = fmaf(k4.x, delta, m[i]);
                m[i + 1] = fmaf(k4.y, delta, m[i + 1]);
                m[i + 2] = fmaf(k4.z, delta, m[i + 2]);
                m[i + 3] = fmaf(k4.w, delta, m[i + 3]);
                o = fmaf(m[i], q4.x, o);
                o = fmaf(m[i + 1], q4.y, o);
                o = fmaf(m[i + 2], q4.z, o);
                o = fmaf(m[i + 3], q4.w, o);
            }
        }
#pragma unroll
        for (int l = 1; l < P; l <<= 1) o += __shfl_xor_sync(0xffffffffu, o, l);
        o *= inv_sqrt_d;
        // gated RMSNorm of the head's output (the barriers inside also end this row's reads of
        // sh_q / sh_k before the next row writes them)
        const float2 so = gdn_block_sum2(lead ? o * o : 0.0f, 0.0f, red);
        if (lead) {
            const float sc = 1.0f / sqrtf(so.x / (float)D + eps);
            const size_t at = row * vd + (size_t)iv * D + j;
            out[at] = ((o * sc) * wn) * gdn_silu(z[at]);
        }
    }
    if (own) {
#pragma unroll
        for (int i = 0; i < E; i += 4) *(float4*)(mp + i) = make_float4(m[i], m[i + 1], m[i + 2], m[i + 3]);
    }
}

// Threads of gdn_recurrence_d<D>: max(D·P, 32).
#define GDN_RECURRENCE(D, P)                                                                                                     \
    extern "C" __global__ void __launch_bounds__(D * P < 32 ? 32 : D * P) gdn_recurrence_d##D(                                   \
        const float* __restrict__ conv, const float* __restrict__ z, const float* __restrict__ alpha,                            \
        const float* __restrict__ beta, const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,                      \
        const float* __restrict__ norm_w, float* __restrict__ state, const u32* __restrict__ seqs, const u32* __restrict__ states, \
        float* __restrict__ out, int n_k, int n_v, long long ssm_off, long long state_len, float eps) {                          \
        gdn_recurrence<D, P>(conv, z, alpha, beta, dt_bias, ssm_a, norm_w, state, seqs, states, out, n_k, n_v, ssm_off,          \
                             state_len, eps);                                                                                    \
    }
GDN_RECURRENCE(16, 1)
GDN_RECURRENCE(32, 1)
GDN_RECURRENCE(64, 1)
GDN_RECURRENCE(128, 2)

// Copies slot `from` of every state layer to slot `to`. `state` is `[n_layers][n_slots][len]`.
// Grid (blocks, n_layers).
extern "C" __global__ void gdn_copy_state_f32(float* __restrict__ state, long long n_slots, long long len, long long from, long long to) {
    pdl_enter();
    const size_t layer = blockIdx.y * (size_t)n_slots * (size_t)len;
    const float* src = state + layer + (size_t)from * (size_t)len;
    float* dst = state + layer + (size_t)to * (size_t)len;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)len; i += stride) dst[i] = src[i];
}
