// Sampling on the device: per-row argmax (greedy; ties → lowest index, NaN never wins, as the CPU
// backend's argmax), and per-row max + log-sum-exp so that a greedy token's log-probability
// (logit − lse) needs no copy of the logits to the host.
#include "common.cuh"

FAK_DEVICE void better(float& bv, u32& bi, float v, u32 i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// The warp's best (value, lowest index), in every lane.
FAK_DEVICE void warp_argmax(float& bv, u32& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(bv, bi, ov, oi);
    }
}

// The block's best (value, lowest index), in every thread (sv, si: 32 entries of shared memory;
// every thread must call it).
FAK_DEVICE void block_argmax(float& bv, u32& bi, float* sv, u32* si) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_argmax(bv, bi);
    if (lane == 0) {
        sv[wid] = bv;
        si[wid] = bi;
    }
    __syncthreads();
    bv = lane < nw ? sv[lane] : NEG_INF;
    bi = lane < nw ? si[lane] : 0xffffffffu;
    warp_argmax(bv, bi);
}

// One block (≤ 1024 threads, multiple of 32) per row of n_cols.
// idx[r] = argmax; when stats != null, stats[r] = (max, log Σ e^(x − max) + max).
extern "C" __global__ void argmax_f32(const float* __restrict__ x, int n_cols, u32* __restrict__ idx, float2* __restrict__ stats) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ float sh[32];
    const float* row = x + (size_t)blockIdx.x * n_cols;
    float bv = -__int_as_float(0x7f800000);
    u32 bi = 0xffffffffu;
    for (int i = threadIdx.x; i < n_cols; i += blockDim.x) better(bv, bi, row[i], (u32)i);
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) idx[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
    if (stats) {
        const float m = bv;  // every thread holds the row max now
        float s = 0.0f;
        if (m > -__int_as_float(0x7f800000)) {
            for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
                const float v = row[i];
                if (v == v) s += expf(v - m);
            }
        }
        s = block_sum(s, sh);
        if (threadIdx.x == 0) stats[blockIdx.x] = make_float2(m, logf(s) + m);
    }
}

// The greedy step on the device: idx[r] = argmax of row r (as argmax_f32) and logprob[r] = its
// log-softmax, −ln Σ e^(x − max) with the sum in f64 (as the CPU backend's greedy_row), so that a
// greedy decode step copies back two numbers per row instead of the row of logits. Two launches
// so that the whole GPU reads the logits (one block per row took ~90 µs for 151,936 columns):
// greedy_partial_f32, grid (G, rows): block g takes the g-th slice of its row and writes its best
// (value, lowest index) and s_g = Σ_slice e^(x − m_g) (f64) around its own max m_g;
// greedy_final_f32, one warp per row: the best of the G partials (value, then lowest index),
// Σ_g s_g·e^(m_g − m) in f64, logprob = −ln of that.
struct GreedyPart {
    float m;
    u32 i;
    double s;
};

extern "C" __global__ void greedy_partial_f32(const float* __restrict__ x, int n_cols, GreedyPart* __restrict__ part) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ double sd[32];
    const int G = gridDim.x, g = blockIdx.x;
    const int per = (n_cols + G - 1) / G;
    const int lo = g * per, hi = min(n_cols, lo + per);
    const float* row = x + (size_t)blockIdx.y * n_cols;
    float bv = NEG_INF;
    u32 bi = 0xffffffffu;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) better(bv, bi, row[i], (u32)i);
    block_argmax(bv, bi, sv, si);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float m = bv;  // every thread holds the slice's max now
    double s = 0.0;
    if (m > NEG_INF) {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float v = row[i];
            if (v == v) s += (double)expf(v - m);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) sd[wid] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < nw; ++w) t += sd[w];
        part[(size_t)blockIdx.y * G + g] = GreedyPart{m, bi, t};
    }
}

// One warp (32 threads) per row; G partials per row.
extern "C" __global__ void greedy_final_f32(const GreedyPart* __restrict__ part, int G, u32* __restrict__ idx, float* __restrict__ logprob) {
    const int lane = threadIdx.x;
    const GreedyPart* p = part + (size_t)blockIdx.x * G;
    float bv = NEG_INF;
    u32 bi = 0xffffffffu;
    for (int g = lane; g < G; g += 32) better(bv, bi, p[g].m, p[g].i);
    warp_argmax(bv, bi);
    double t = 0.0;
    if (bv > NEG_INF) {
        for (int g = lane; g < G; g += 32)
            if (p[g].m > NEG_INF) t += p[g].s * exp((double)p[g].m - (double)bv);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (lane == 0) {
        idx[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
        logprob[blockIdx.x] = t > 0.0 ? -(float)log(t) : 0.0f;
    }
}
