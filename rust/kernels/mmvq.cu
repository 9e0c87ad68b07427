// Quantized GEMV for decode: y[c, o] = Σ_i W[o, i]·x[c, i] (+ bias[o]) (+ y[c, o] when
// accumulating: the residual add fused into the epilogue) for NC ≤ 8 activation rows, W in its
// GGUF blocks, x in the 8-bit form of the weight format's ggml vec_dot_type, quantized exactly as
// fak's CPU backend does (see common.cuh): the q8_0 form for the legacy formats, the q8_K form for
// the k-quants. Integer dot products with dp4a (the approach of llama.cpp's mul_mat_vec_q; the code
// is fak's own) are exact; each task's integer sum is scaled as the CPU's ggml_vec_dot_* scales its
// block or super-block sums (`(d_w·d_x)·Σ` and, for Q4_K/Q5_K, `(d_x·dmin)·Σ m·bsum`), so CPU and
// GPU differ only in the order of the f32 additions.
//
// Every format is cut into tasks of 32 weights:
//   legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): one task = one block of 32;
//   Q4_K, Q5_K: task (super-block sb, c in 0..8): 16 low-nibble values of sub-block 2(c/2) and
//     the 16 high-nibble values of sub-block 2(c/2)+1 sharing the same bytes; the two sub-blocks'
//     min term (−dmin·m·Σq) is added once, by the c even task;
//   Q6_K: task (sb, c): 8 positions l of half n = c/4 times the four 32-groups that share them.
// Launch: 128 threads; R = rows per block (1, 2, 4), 4/R warps split a row's tasks; R = 8: half
// a warp per row (rows of 33..63 tasks). One launch
// may cover up to three matrices of the same input (Q/K/V, gate/up): "segments" of the grid.
// Each block asks L2 for its rows of W before `pdl_enter()` (common.cuh): launched early on
// Hopper, it fetches its weights while the kernel before it (the norm or the quantizer that makes
// its activations) still runs.
#include "quants.cuh"

// The rows of one matrix handled by local block `lb` of its segment.
template <int FMT, int NC>
__device__ void mmvq_rows(const u8* __restrict__ W, size_t row_bytes, const i8* __restrict__ yq, const void* __restrict__ ya,
                          const int* __restrict__ ys, const float* __restrict__ bias, float* __restrict__ dst, int K, int n_out, int rpb,
                          int lb, bool accumulate) {
    __shared__ float sh[4][NC];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int T = K / 32;
    if (rpb == 8) {
        // Half a warp per row, 8 rows per block: for rows of 33..63 tasks, which 32 lanes would
        // split unevenly (K = 1536: 48 tasks, 2 on half the lanes, 1 on the others).
        const int sl = lane & 15;
        const int row = lb * 8 + warp * 2 + (lane >> 4);
        float acc[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
        if (row < n_out) {
            const u8* wr = W + (size_t)row * row_bytes;
#pragma unroll 4
            for (int t = sl; t < T; t += 16) Quant<FMT>::template dot<NC>(wr, t, yq, ya, ys, K, acc);
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
        }
        if (row < n_out && sl < NC) {
            float v = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; ++c)
                if (sl == c) v = acc[c];
            if (bias) v += bias[row];
            float* o = dst + (size_t)sl * n_out + row;
            *o = accumulate ? *o + v : v;
        }
        return;
    }
    const int wpr = 4 / rpb;
    const int row = lb * rpb + warp / wpr;
    const int sub = (warp % wpr) * 32 + lane, nthr = wpr * 32;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    if (row < n_out) {
        const u8* wr = W + (size_t)row * row_bytes;
#pragma unroll 4
        for (int t = sub; t < T; t += nthr) Quant<FMT>::template dot<NC>(wr, t, yq, ya, ys, K, acc);
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = warp_sum(acc[c]);
    if (lane == 0) {
#pragma unroll
        for (int c = 0; c < NC; ++c) sh[warp][c] = acc[c];
    }
    __syncthreads();
    if (warp % wpr == 0 && lane < NC && row < n_out) {
        float v = 0.0f;
        for (int w = 0; w < wpr; ++w) v += sh[warp + w][lane];
        if (bias) v += bias[row];
        float* o = dst + (size_t)lane * n_out + row;
        *o = accumulate ? *o + v : v;
    }
}

// A launch over up to three matrices ("segments") that read the same activations: blocks
// [0, end0) run matrix 0, [end0, end1) matrix 1, [end1, end2) matrix 2. KFORM: the k-quants on
// the q8_K form; else the legacy formats on the q8_0 form. The format switch is uniform per block.
template <int NC, bool KFORM>
__device__ void mmvq_multi(const u8* W0, size_t rb0, const float* b0, float* d0, int n0, int rpb0, int f0, int end0,
                           const u8* W1, size_t rb1, const float* b1, float* d1, int n1, int rpb1, int f1, int end1,
                           const u8* W2, size_t rb2, const float* b2, float* d2, int n2, int rpb2, int f2,
                           const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, int accumulate) {
    const int blk = blockIdx.x;
    const int s = blk < end0 ? 0 : (blk < end1 ? 1 : 2);
    const u8* W = s == 0 ? W0 : (s == 1 ? W1 : W2);
    const size_t rb = s == 0 ? rb0 : (s == 1 ? rb1 : rb2);
    const float* bias = s == 0 ? b0 : (s == 1 ? b1 : b2);
    float* dst = s == 0 ? d0 : (s == 1 ? d1 : d2);
    const int n_out = s == 0 ? n0 : (s == 1 ? n1 : n2);
    const int rpb = s == 0 ? rpb0 : (s == 1 ? rpb1 : rpb2);
    const int fmt = s == 0 ? f0 : (s == 1 ? f1 : f2);
    const int lb = blk - (s == 0 ? 0 : (s == 1 ? end0 : end1));
    const bool acc = accumulate != 0;
    // The block's rows of W are read-only: ask for them before waiting on the kernel before.
    const int r0 = lb * rpb, r1 = min(r0 + rpb, n_out);
    if (r0 < r1) prefetch_l2(W + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    pdl_enter();
    if (KFORM) {
        switch (fmt) {
            case T_Q4_K: mmvq_rows<T_Q4_K, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
            case T_Q5_K: mmvq_rows<T_Q5_K, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
            case T_Q6_K: mmvq_rows<T_Q6_K, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
        }
    } else {
        switch (fmt) {
            case T_Q4_0: mmvq_rows<T_Q4_0, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
            case T_Q4_1: mmvq_rows<T_Q4_1, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
            case T_Q5_0: mmvq_rows<T_Q5_0, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
            case T_Q5_1: mmvq_rows<T_Q5_1, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
            case T_Q8_0: mmvq_rows<T_Q8_0, NC>(W, rb, yq, ya, ys, bias, dst, K, n_out, rpb, lb, acc); break;
        }
    }
}

// Dense weights (F32, F16, BF16) against f32 activations: tasks of 8 values (K % 8 == 0).
// blockIdx.y picks a chunk of NC activation rows (x and dst advanced by NC rows per chunk): many
// rows in one launch, each row's sums as in a launch of its own.
template <int FMT, int NC>
__device__ void mmv_dense(const u8* __restrict__ W, size_t row_bytes, const float* __restrict__ x, const float* __restrict__ bias,
                          float* __restrict__ dst, int K, int n_out, int rpb, int accumulate) {
    __shared__ float sh[4][NC];
    x += (size_t)blockIdx.y * NC * K;
    dst += (size_t)blockIdx.y * NC * n_out;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wpr = 4 / rpb;
    const int row = blockIdx.x * rpb + warp / wpr;
    const int sub = (warp % wpr) * 32 + lane, nthr = wpr * 32;
    const int r0 = blockIdx.x * rpb, r1 = min(r0 + rpb, n_out);
    if (r0 < r1) prefetch_l2(W + (size_t)r0 * row_bytes, (size_t)(r1 - r0) * row_bytes);
    pdl_enter();
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    if (row < n_out) {
        const u8* wr = W + (size_t)row * row_bytes;
        for (int t = sub; t < K / 8; t += nthr) {
            float w[8];
            Quant<FMT>::deq8(wr, 8 * t, w);
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const float4* xp = (const float4*)(x + (size_t)c * K + 8 * t);
                const float4 a = xp[0], b = xp[1];
                acc[c] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = warp_sum(acc[c]);
    if (lane == 0) {
#pragma unroll
        for (int c = 0; c < NC; ++c) sh[warp][c] = acc[c];
    }
    __syncthreads();
    if (warp % wpr == 0 && lane < NC && row < n_out) {
        float v = 0.0f;
        for (int w = 0; w < wpr; ++w) v += sh[warp + w][lane];
        if (bias) v += bias[row];
        float* o = dst + (size_t)lane * n_out + row;
        *o = accumulate ? *o + v : v;
    }
}

// The expert GEMV of a mixture-of-experts FFN (ggml mul_mat_id with the ids on the device): pair p
// (blockIdx.y) multiplies expert e = ids[p] of the stacked matrices (W + e·estride) with activation
// row i = x_per_pair ? p : p / k, into dst[p, :]. blockIdx.z picks the matrix: 0 (W0 → d0) or 1
// (W1 → d1; gate and up of one input in one launch). grid (⌈n_out/rpb⌉, n_pairs, 1 or 2).
template <bool KFORM>
__device__ void mmvq_id(const u8* W0, const u8* W1, size_t rb, size_t estride, float* d0, float* d1, int n_out, int rpb, int fmt,
                        const float* __restrict__ ids, int k, int x_per_pair, const i8* __restrict__ yq, const void* __restrict__ ya,
                        const int* __restrict__ ys, int K) {
    pdl_enter();  // the ids come from the kernel before
    const int p = blockIdx.y;
    const int e = (int)ids[p];
    const size_t i = x_per_pair ? (size_t)p : (size_t)(p / k);
    const u8* W = (blockIdx.z == 0 ? W0 : W1) + (size_t)e * estride;
    float* dst = (blockIdx.z == 0 ? d0 : d1) + (size_t)p * n_out;
    const i8* q = yq + i * K;
    const int* sm = KFORM ? ys + i * (K / 32) : nullptr;
    const void* a = KFORM ? (const void*)((const float*)ya + i * (K / 256)) : (const void*)((const float2*)ya + i * (K / 32));
    const int lb = blockIdx.x;
    if (KFORM) {
        switch (fmt) {
            case T_Q4_K: mmvq_rows<T_Q4_K, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
            case T_Q5_K: mmvq_rows<T_Q5_K, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
            case T_Q6_K: mmvq_rows<T_Q6_K, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
        }
    } else {
        switch (fmt) {
            case T_Q4_0: mmvq_rows<T_Q4_0, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
            case T_Q4_1: mmvq_rows<T_Q4_1, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
            case T_Q5_0: mmvq_rows<T_Q5_0, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
            case T_Q5_1: mmvq_rows<T_Q5_1, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
            case T_Q8_0: mmvq_rows<T_Q8_0, 1>(W, rb, q, a, sm, nullptr, dst, K, n_out, rpb, lb, false); break;
        }
    }
}

#define MMVQ_ID(NAME, KFORM)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mmvq_id_##NAME(                                                   \
        const u8* W0, const u8* W1, size_t rb, size_t estride, float* d0, float* d1, int n_out, int rpb, int fmt,      \
        const float* __restrict__ ids, int k, int x_per_pair, const i8* __restrict__ yq, const void* __restrict__ ya,  \
        const int* __restrict__ ys, int K) {                                                                           \
        mmvq_id<KFORM>(W0, W1, rb, estride, d0, d1, n_out, rpb, fmt, ids, k, x_per_pair, yq, ya, ys, K);              \
    }
MMVQ_ID(kquant_q8_K, true)
MMVQ_ID(legacy_q8_0, false)

#define MMVQ_MULTI(NAME, KFORM, NC)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) mmvq_##NAME##_c##NC(                                              \
        const u8* W0, size_t rb0, const float* b0, float* d0, int n0, int rpb0, int f0, int end0,                        \
        const u8* W1, size_t rb1, const float* b1, float* d1, int n1, int rpb1, int f1, int end1,                        \
        const u8* W2, size_t rb2, const float* b2, float* d2, int n2, int rpb2, int f2,                                  \
        const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, int accumulate) {     \
        mmvq_multi<NC, KFORM>(W0, rb0, b0, d0, n0, rpb0, f0, end0, W1, rb1, b1, d1, n1, rpb1, f1, end1, W2, rb2, b2, d2, \
                              n2, rpb2, f2, yq, ya, ys, K, accumulate);                                                  \
    }
#define MMV_DENSE(NAME, FMT, NC)                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) mmv_##NAME##_f32_c##NC(                                             \
        const u8* __restrict__ W, size_t row_bytes, const float* __restrict__ x, const float* __restrict__ bias,           \
        float* __restrict__ dst, int K, int n_out, int rpb, int accumulate) {                                             \
        mmv_dense<FMT, NC>(W, row_bytes, x, bias, dst, K, n_out, rpb, accumulate);                                        \
    }
#define ALL_NC(M, NAME, X) M(NAME, X, 1) M(NAME, X, 2) M(NAME, X, 3) M(NAME, X, 4) M(NAME, X, 5) M(NAME, X, 6) M(NAME, X, 7) M(NAME, X, 8)

// mmvq_kquant_q8_K_c<NC>: Q4_K, Q5_K, Q6_K on the q8_K form; mmvq_legacy_q8_0_c<NC>: Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0 on the q8_0 form.
ALL_NC(MMVQ_MULTI, kquant_q8_K, true)
ALL_NC(MMVQ_MULTI, legacy_q8_0, false)
ALL_NC(MMV_DENSE, f32, T_F32)
ALL_NC(MMV_DENSE, f16, T_F16)
ALL_NC(MMV_DENSE, bf16, T_BF16)
