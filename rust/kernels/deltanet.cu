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

// ---- chunked prefill -------------------------------------------------------------------------
//
// gdn_chunk_d<D>: the same recurrence over chunks of GDN_CHUNK rows (the WY form of the gated
// delta rule, flash-linear-attention's chunk_gated_delta_rule). With S the head's state as
// `S[i][j]` (key i, value j) at the chunk's start, G_t = Σ_{u ≤ t} g_u the cumulative log-decay
// inside the chunk, and the per-token rule S_t = e^{g_t}·S_{t−1} + k_t·δ_tᵀ,
// δ_t = β_t·(v_t − e^{g_t}·S_{t−1}ᵀk_t):
//   (I + A)·Δ = R,  A[t][u] = β_t·e^{G_t − G_u}·(k_t·k_u) (u < t),  R_t = β_t·(v_t − e^{G_t}·S_0ᵀk_t),
//   o_t = (e^{G_t}·S_0ᵀq_t + Σ_{u ≤ t} e^{G_t − G_u}·(q_t·k_u)·δ_u)/√D,
//   S_C = e^{G_last}·S_0 + Σ_u e^{G_last − G_u}·k_u·δ_uᵀ.
// Δ is solved by forward substitution on R itself (the same as flash-linear-attention's
// U − W·S_0 with U = T·(β·V), W = T·(β·e^G·K), T = (I + A)⁻¹, with fewer products). Value
// columns are independent, so a block holds a slice of GDN_CHUNK_JB(D) of them: grid (n_seqs,
// n_v_heads, D/JB), GDN_CHUNK_THREADS threads, gdn_chunk_smem(D) bytes of dynamic shared memory
// (ops/deltanet.rs computes the same). Rows past a sequence's last row are zero (β = g = 0), so a
// partial chunk needs no other care. The outputs are o_t before the gated RMSNorm, which spans the
// whole head: gdn_gated_norm_f32 applies it afterwards. tests/test_gdn_chunk_model.py models this
// arithmetic in numpy.
#define GDN_CHUNK 64
#define GDN_CHUNK_THREADS 256

template <int D, int JB>
struct GdnChunkLayout {
    static constexpr int C = GDN_CHUNK;
    static constexpr int DP = D + 4;                           // row stride of q, k (float4 rows, no bank conflicts)
    static constexpr int SP = JB + (JB % 32 == 0 ? 16 : 0);    // row stride of the state slice S[i][jj]
    static constexpr int VP = JB + 4;                          // row stride of R / Δ
    static constexpr int CP = C + 1;                           // row stride of A and Q·Kᵀ
    static constexpr int Q = 0, K = Q + C * DP, S = K + C * DP, R = S + D * SP, A = R + C * VP, QK = A + C * CP;
    static constexpr int G = QK + C * CP, B = G + C, F = B + C, FLOATS = F + C;
};

template <int D, int JB>
__device__ void gdn_chunk(const float* __restrict__ conv, const float* __restrict__ alpha, const float* __restrict__ beta,
                          const float* __restrict__ dt_bias, const float* __restrict__ ssm_a, float* __restrict__ state,
                          const u32* __restrict__ seqs, const u32* __restrict__ states, float* __restrict__ out, int n_k, int n_v,
                          long long ssm_off, long long state_len, float eps) {
    using L = GdnChunkLayout<D, JB>;
    constexpr int C = GDN_CHUNK, NT = GDN_CHUNK_THREADS, NW = NT / 32;
    constexpr int TM = C / 16;    // rows t per thread in the C×C and C×JB tiles
    constexpr int TJ = JB / 16;   // value columns per thread
    constexpr int TI = D / 16;    // state rows i per thread in the state update
    constexpr int TPC = NT / JB;  // threads per value column in the forward substitution
    constexpr int QW = (D + 31) / 32;
    static_assert(C == 64 && NT == 256, "the scan and the 16×16 tiles assume 64 rows, 256 threads");
    static_assert(JB % 16 == 0 && D % JB == 0 && D % 16 == 0 && TPC <= 32 && 32 % TPC == 0, "slices");
    extern __shared__ __align__(16) float gdn_smem[];
    float* const sQ = gdn_smem + L::Q;
    float* const sK = gdn_smem + L::K;
    float* const sS = gdn_smem + L::S;
    float* const sR = gdn_smem + L::R;
    float* const sA = gdn_smem + L::A;
    float* const sQK = gdn_smem + L::QK;
    float* const sG = gdn_smem + L::G;
    float* const sB = gdn_smem + L::B;
    float* const sF = gdn_smem + L::F;
    pdl_enter();
    const int s = blockIdx.x, iv = blockIdx.y, j0 = blockIdx.z * JB, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, tc = tid & 15, tr = tid >> 4;
    const u32 row0 = seqs[5 * s], n_rows = seqs[5 * s + 1], n_past = seqs[5 * s + 2];
    if (n_rows == 0) return;  // the whole block
    const int ik = iv % n_k;
    const int conv_dim = (2 * n_k + n_v) * D, vd = n_v * D;
    float* mp = state + (size_t)states[s] * (size_t)state_len + (size_t)ssm_off + (size_t)iv * D * D;
    for (int e = tid; e < D * JB; e += NT) {
        const int jj = e / D, i = e % D;
        sS[i * L::SP + jj] = n_past != 0 ? mp[(size_t)(j0 + jj) * D + i] : 0.0f;
    }
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    const float l2_eps = eps / (float)D;
    const float dt = dt_bias[iv], av = ssm_a[iv];
    for (u32 c0 = 0; c0 < n_rows; c0 += C) {
        const int nc = (int)min((u32)C, n_rows - c0);
        // 1. q and k L2-normalized, the gates; zeros past the last row
        for (int t = warp; t < C; t += NW) {
            const size_t row = (size_t)row0 + c0 + t;
            float qv[QW], kv[QW];
            float sq = 0.0f, sk = 0.0f;
#pragma unroll
            for (int u = 0; u < QW; ++u) {
                const int i = lane + 32 * u;
                const bool in = t < nc && i < D;
                qv[u] = in ? conv[row * conv_dim + ik * D + i] : 0.0f;
                kv[u] = in ? conv[row * conv_dim + n_k * D + ik * D + i] : 0.0f;
                sq = fmaf(qv[u], qv[u], sq);
                sk = fmaf(kv[u], kv[u], sk);
            }
            sq = warp_sum(sq);
            sk = warp_sum(sk);
            const float qs = 1.0f / sqrtf(sq / (float)D + l2_eps), ks = 1.0f / sqrtf(sk / (float)D + l2_eps);
#pragma unroll
            for (int u = 0; u < QW; ++u) {
                const int i = lane + 32 * u;
                if (i < D) {
                    sQ[t * L::DP + i] = (qv[u] * qs) * inv_sqrt_d;
                    sK[t * L::DP + i] = (kv[u] * ks) * inv_sqrt_d;
                }
            }
            if (lane == 0) {
                float b = 0.0f, g = 0.0f;
                if (t < nc) {
                    b = 1.0f / (1.0f + expf(-beta[row * n_v + iv]));
                    const float ax = alpha[row * n_v + iv] + dt;
                    g = (ax > 20.0f ? ax : logf(1.0f + expf(ax))) * av;
                }
                sB[t] = b;
                sG[t] = g;
            }
        }
        __syncthreads();
        // 2. G: the cumulative log-decay (an inclusive scan by warp 0); F_u = e^{G_last − G_u}
        if (warp == 0) {
            float lo = sG[lane], hi = sG[lane + 32];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float a = __shfl_up_sync(0xffffffffu, lo, o), b = __shfl_up_sync(0xffffffffu, hi, o);
                if (lane >= o) {
                    lo += a;
                    hi += b;
                }
            }
            hi += __shfl_sync(0xffffffffu, lo, 31);
            const float last = __shfl_sync(0xffffffffu, hi, 31);
            sG[lane] = lo;
            sG[lane + 32] = hi;
            sF[lane] = expf(last - lo);
            sF[lane + 32] = expf(last - hi);
        }
        __syncthreads();
        // 3. A and the decayed causal Q·Kᵀ (C×C), R and e^G·Q·S_0 (C×JB)
        {
            float kk[TM][TM], qk[TM][TM];
#pragma unroll
            for (int a = 0; a < TM; ++a)
#pragma unroll
                for (int b = 0; b < TM; ++b) kk[a][b] = qk[a][b] = 0.0f;
            for (int i = 0; i < D; i += 4) {
                float4 kt[TM], qt[TM], ku[TM];
#pragma unroll
                for (int a = 0; a < TM; ++a) {
                    kt[a] = *(const float4*)(sK + (tr + 16 * a) * L::DP + i);
                    qt[a] = *(const float4*)(sQ + (tr + 16 * a) * L::DP + i);
                    ku[a] = *(const float4*)(sK + (tc + 16 * a) * L::DP + i);
                }
#pragma unroll
                for (int a = 0; a < TM; ++a)
#pragma unroll
                    for (int b = 0; b <= a; ++b) {  // b > a: u > t everywhere in the tile, masked
                        kk[a][b] = fmaf(kt[a].x, ku[b].x, kk[a][b]);
                        kk[a][b] = fmaf(kt[a].y, ku[b].y, kk[a][b]);
                        kk[a][b] = fmaf(kt[a].z, ku[b].z, kk[a][b]);
                        kk[a][b] = fmaf(kt[a].w, ku[b].w, kk[a][b]);
                        qk[a][b] = fmaf(qt[a].x, ku[b].x, qk[a][b]);
                        qk[a][b] = fmaf(qt[a].y, ku[b].y, qk[a][b]);
                        qk[a][b] = fmaf(qt[a].z, ku[b].z, qk[a][b]);
                        qk[a][b] = fmaf(qt[a].w, ku[b].w, qk[a][b]);
                    }
            }
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                const int t = tr + 16 * a;
                const float gt = sG[t], bt = sB[t];
#pragma unroll
                for (int b = 0; b < TM; ++b) {
                    const int u = tc + 16 * b;
                    const float dec = b <= a && u <= t ? expf(gt - sG[u]) : 0.0f;
                    sA[t * L::CP + u] = u < t ? bt * (dec * kk[a][b]) : 0.0f;
                    sQK[t * L::CP + u] = dec * qk[a][b];
                }
            }
        }
        float qs[TM][TJ];
        {
            float ks[TM][TJ];
#pragma unroll
            for (int a = 0; a < TM; ++a)
#pragma unroll
                for (int b = 0; b < TJ; ++b) ks[a][b] = qs[a][b] = 0.0f;
            for (int i = 0; i < D; i += 4) {
                float4 kt[TM], qt[TM];
                float sv[4][TJ];
#pragma unroll
                for (int a = 0; a < TM; ++a) {
                    kt[a] = *(const float4*)(sK + (tr + 16 * a) * L::DP + i);
                    qt[a] = *(const float4*)(sQ + (tr + 16 * a) * L::DP + i);
                }
#pragma unroll
                for (int e = 0; e < 4; ++e)
#pragma unroll
                    for (int b = 0; b < TJ; ++b) sv[e][b] = sS[(i + e) * L::SP + tc + 16 * b];
#pragma unroll
                for (int a = 0; a < TM; ++a)
#pragma unroll
                    for (int b = 0; b < TJ; ++b) {
                        ks[a][b] = fmaf(kt[a].x, sv[0][b], ks[a][b]);
                        ks[a][b] = fmaf(kt[a].y, sv[1][b], ks[a][b]);
                        ks[a][b] = fmaf(kt[a].z, sv[2][b], ks[a][b]);
                        ks[a][b] = fmaf(kt[a].w, sv[3][b], ks[a][b]);
                        qs[a][b] = fmaf(qt[a].x, sv[0][b], qs[a][b]);
                        qs[a][b] = fmaf(qt[a].y, sv[1][b], qs[a][b]);
                        qs[a][b] = fmaf(qt[a].z, sv[2][b], qs[a][b]);
                        qs[a][b] = fmaf(qt[a].w, sv[3][b], qs[a][b]);
                    }
            }
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                const int t = tr + 16 * a;
                const float e = expf(sG[t]), bt = sB[t];
                const size_t vrow = ((size_t)row0 + c0 + t) * conv_dim + 2 * n_k * D + iv * D + j0;
#pragma unroll
                for (int b = 0; b < TJ; ++b) {
                    const int jj = tc + 16 * b;
                    const float v = t < nc ? conv[vrow + jj] : 0.0f;
                    sR[t * L::VP + jj] = bt * (v - e * ks[a][b]);
                    qs[a][b] *= e;
                }
            }
        }
        __syncthreads();
        // 4. (I + A)·Δ = R by forward substitution, in place; each column within one warp
        {
            const int col = warp * (32 / TPC) + lane / TPC, part = lane % TPC;
            for (int t = 1; t < nc; ++t) {
                float acc = 0.0f;
                for (int u = part; u < t; u += TPC) acc = fmaf(sA[t * L::CP + u], sR[u * L::VP + col], acc);
#pragma unroll
                for (int l = 1; l < TPC; l <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, l);
                if (part == 0) sR[t * L::VP + col] -= acc;
                __syncwarp();
            }
        }
        __syncthreads();
        // 5. the outputs (before the gated RMSNorm) and the state at the chunk's end
        {
            float o[TM][TJ];
#pragma unroll
            for (int a = 0; a < TM; ++a)
#pragma unroll
                for (int b = 0; b < TJ; ++b) o[a][b] = qs[a][b];
            for (int u = 0; u < nc; ++u) {
                float q[TM], d[TJ];
#pragma unroll
                for (int a = 0; a < TM; ++a) q[a] = sQK[(tr + 16 * a) * L::CP + u];
#pragma unroll
                for (int b = 0; b < TJ; ++b) d[b] = sR[u * L::VP + tc + 16 * b];
#pragma unroll
                for (int a = 0; a < TM; ++a)
#pragma unroll
                    for (int b = 0; b < TJ; ++b) o[a][b] = fmaf(q[a], d[b], o[a][b]);
            }
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                const int t = tr + 16 * a;
                if (t < nc) {
#pragma unroll
                    for (int b = 0; b < TJ; ++b) out[((size_t)row0 + c0 + t) * vd + (size_t)iv * D + j0 + tc + 16 * b] = o[a][b] * inv_sqrt_d;
                }
            }
        }
        {
            const float el = expf(sG[C - 1]);
            float sv[TI][TJ];
#pragma unroll
            for (int a = 0; a < TI; ++a)
#pragma unroll
                for (int b = 0; b < TJ; ++b) sv[a][b] = sS[(tr + 16 * a) * L::SP + tc + 16 * b] * el;
            for (int u = 0; u < nc; ++u) {
                const float f = sF[u];
                float k[TI], d[TJ];
#pragma unroll
                for (int a = 0; a < TI; ++a) k[a] = sK[u * L::DP + tr + 16 * a];
#pragma unroll
                for (int b = 0; b < TJ; ++b) d[b] = sR[u * L::VP + tc + 16 * b] * f;
#pragma unroll
                for (int a = 0; a < TI; ++a)
#pragma unroll
                    for (int b = 0; b < TJ; ++b) sv[a][b] = fmaf(k[a], d[b], sv[a][b]);
            }
#pragma unroll
            for (int a = 0; a < TI; ++a)
#pragma unroll
                for (int b = 0; b < TJ; ++b) sS[(tr + 16 * a) * L::SP + tc + 16 * b] = sv[a][b];
        }
        __syncthreads();
    }
    for (int e = tid; e < D * JB; e += NT) {
        const int jj = e / D, i = e % D;
        mp[(size_t)(j0 + jj) * D + i] = sS[i * L::SP + jj];
    }
}

// Value columns per block of gdn_chunk_d<D>: GDN_CHUNK_JB(D); dynamic shared memory:
// GdnChunkLayout<D, JB>::FLOATS floats.
#define GDN_CHUNK_JB(D) ((D) < 32 ? (D) : 32)
#define GDN_CHUNK_KERNEL(D)                                                                                                       \
    extern "C" __global__ void __launch_bounds__(GDN_CHUNK_THREADS, 1) gdn_chunk_d##D(                                          \
        const float* __restrict__ conv, const float* __restrict__ alpha, const float* __restrict__ beta,                          \
        const float* __restrict__ dt_bias, const float* __restrict__ ssm_a, float* __restrict__ state, const u32* __restrict__ seqs, \
        const u32* __restrict__ states, float* __restrict__ out, int n_k, int n_v, long long ssm_off, long long state_len,        \
        float eps) {                                                                                                              \
        gdn_chunk<D, GDN_CHUNK_JB(D)>(conv, alpha, beta, dt_bias, ssm_a, state, seqs, states, out, n_k, n_v, ssm_off, state_len,  \
                                      eps);                                                                                       \
    }
GDN_CHUNK_KERNEL(16)
GDN_CHUNK_KERNEL(32)
GDN_CHUNK_KERNEL(64)
GDN_CHUNK_KERNEL(128)

// The gated RMSNorm of the chunked path, in place on `x` `[n_rows, n_v·d]` (o before the norm):
// rms_norm(o)·w_norm ⊙ silu(z) per head, as the end of gdn_recurrence. Grid (n_rows,
// ⌈n_v/4⌉), 128 threads: one warp per (row, head).
extern "C" __global__ void gdn_gated_norm_f32(float* __restrict__ x, const float* __restrict__ z, const float* __restrict__ norm_w,
                                              int n_v, int d, float eps) {
    pdl_enter();
    const int head = blockIdx.y * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (head >= n_v) return;
    const size_t base = (size_t)blockIdx.x * n_v * d + (size_t)head * d;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) ss = fmaf(x[base + i], x[base + i], ss);
    ss = warp_sum(ss);
    const float sc = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = lane; i < d; i += 32) x[base + i] = ((x[base + i] * sc) * norm_w[i]) * gdn_silu(z[base + i]);
}

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
