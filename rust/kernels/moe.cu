// Mixture-of-experts kernels besides the expert matmuls (those are `mmvq_id_*` in mmvq.cu and
// `mmq_id_*` in mmq.cu): the fused router (softmax, top-k, renormalization: llama.cpp
// `build_moe_ffn` with softmax gating, as fak's CPU backend computes it in
// rust/src/backend/cpu/moe.rs), the expert sort that groups (row, expert) pairs by expert for the
// grouped GEMM of prefill (llama.cpp's `mmid` compact index; the code is fak's own), the gather of
// the pairs' 8-bit activations into that order, and the weighted sum of the experts' outputs into
// the residual. Everything stays on the device: no host synchronisation, so a decode step with a
// MoE FFN is still one CUDA graph.
//
// Expert ids travel as f32 values (exact below 2^24) in ordinary activation buffers.
#include "common.cuh"

// The most experts a layer may have (llama.cpp LLAMA_MAX_EXPERTS).
#define MOE_MAX_EXPERTS 512
#define MOE_PER_LANE (MOE_MAX_EXPERTS / 32)

// One warp per row of `logits` ([n_rows, ne]): p = softmax(row); the k largest p (ties: the
// lowest expert id) into ids[r·k + s] (as f32) and their p into w[r·k + s], divided by their sum
// (f64, rounded to f32, clamped at 2^-14) when norm_w, times w_scale unless it is 0 or 1.
extern "C" __global__ void __launch_bounds__(32) moe_route_f32(const float* __restrict__ logits, float* __restrict__ ids,
                                                             float* __restrict__ w, int ne, int k, int norm_w, float w_scale) {
    pdl_enter();
    const int lane = threadIdx.x;
    const size_t r = blockIdx.x;
    const float* row = logits + r * ne;
    float p[MOE_PER_LANE];
    float mx = NEG_INF;
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        p[j] = e < ne ? row[e] : NEG_INF;
        mx = fmaxf(mx, p[j]);
    }
    mx = warp_max(mx);
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        p[j] = e < ne ? expf(p[j] - mx) : 0.0f;
        sum += (double)p[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) p[j] = p[j] * inv;
    // k rounds of a warp arg-max; the winner's lane retires it (p = -1: probabilities are ≥ 0).
    float wsel = 0.0f;  // lane s holds the weight of slot s (k ≤ 32 here; larger k: see below)
    double wsum = 0.0;
    for (int s = 0; s < k; ++s) {
        float bv = -2.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < MOE_PER_LANE; ++j) {
            const int e = lane + 32 * j;
            if (e < ne && (p[j] > bv || (p[j] == bv && e < bi))) {
                bv = p[j];
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if ((bi & 31) == lane) {
#pragma unroll
            for (int j = 0; j < MOE_PER_LANE; ++j)
                if (lane + 32 * j == bi) p[j] = -1.0f;
        }
        if (lane == 0) ids[r * k + s] = (float)bi;
        if (s < 32 && lane == s) wsel = bv;
        if (s >= 32 && lane == 0) w[r * k + s] = bv;
        wsum += (double)bv;
    }
    float scale = 1.0f;
    float div = 1.0f;
    if (norm_w) div = fmaxf((float)wsum, 6.103515625e-5f);
    if (w_scale != 0.0f && w_scale != 1.0f) scale = w_scale;
    if (lane < k && lane < 32) w[r * k + lane] = norm_w ? (wsel / div) * scale : wsel * scale;
    if (k > 32 && lane == 0) {
        for (int s = 32; s < k; ++s) w[r * k + s] = norm_w ? (w[r * k + s] / div) * scale : w[r * k + s] * scale;
    }
}

// res[r, i] = (Σ_s w[r·k + s]·E[q(r·k + s), i]) + res[r, i], the products summed in slot order,
// where q(p) = pos[p] when `pos` is given (the experts' outputs in expert-sorted order) else p.
// grid (n_rows, ⌈dim/256⌉), 256 threads.
extern "C" __global__ void moe_combine_f32(const float* __restrict__ E, const float* __restrict__ w, const u32* __restrict__ pos,
                                           float* __restrict__ res, int k, int dim) {
    pdl_enter();
    const size_t r = blockIdx.x;
    const int i = blockIdx.y * 256 + threadIdx.x;
    if (i >= dim) return;
    float acc = 0.0f;
    for (int s = 0; s < k; ++s) {
        const size_t p = r * k + s;
        const size_t q = pos ? (size_t)pos[p] : p;
        const float v = __fmul_rn(E[q * dim + i], w[p]);  // no FMA contraction: the CPU's roundings
        acc = s == 0 ? v : __fadd_rn(acc, v);
    }
    res[r * dim + i] = __fadd_rn(acc, res[r * dim + i]);
}

// The expert sort of n_pairs (row, expert) pairs (one block of 1024 threads = 32 warps): pairs
// grouped by expert, each expert's pairs in pair order. Writes
//   sorted[j]  the pair at sorted position j,  pos[p]  the sorted position of pair p;
//   tiles[0] = the number of GEMM tiles, tiles[1 + 3t ..] = (expert, first sorted position, rows)
//   of tile t: each expert's pairs cut into tiles of `bn` rows, experts in id order.
// A stable counting sort: warp w owns the w-th of 32 contiguous chunks of the pairs; it counts
// its chunk's pairs per expert (one `__match_any_sync` per 32 pairs: the lowest lane of each
// group of equal ids adds the group's size), an exclusive prefix over the warps gives each warp
// its first rank within every expert, a warp scan over the experts their offsets, and a second
// pass over the chunk places each pair at offset + the warp's running rank + its earlier peers in
// the step. Every pair is read twice (the previous version scanned all pairs once per expert:
// 2048 dependent steps per warp at 8192 tokens × 8 of 128 experts).
// Dynamic shared memory: 32·ne ints. ids (f32 values) must be in 0..ne; ne ≤ MOE_MAX_EXPERTS.
extern "C" __global__ void __launch_bounds__(1024) moe_sort(const float* __restrict__ ids, u32* __restrict__ sorted, u32* __restrict__ pos,
                                                         u32* __restrict__ tiles, int n_pairs, int ne, int bn) {
    pdl_enter();
    extern __shared__ int moe_wc[];  // [32][ne]: the warp's count of each expert, then its running rank
    __shared__ int cnt[MOE_MAX_EXPERTS];
    __shared__ int off[MOE_MAX_EXPERTS];
    __shared__ int toff[MOE_MAX_EXPERTS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < 32 * ne; i += blockDim.x) moe_wc[i] = 0;
    const int chunk = (((n_pairs + 31) / 32) + 31) & ~31;
    const int p0 = warp * chunk, p1 = min(n_pairs, p0 + chunk);
    int* const wc = moe_wc + warp * ne;
    __syncthreads();
    for (int b = p0; b < p1; b += 32) {
        const int p = b + lane;
        const int e = p < p1 ? (int)ids[p] : -1;
        const u32 peers = __match_any_sync(0xffffffffu, e);
        if (e >= 0 && lane == __ffs(peers) - 1) wc[e] += __popc(peers);
        __syncwarp();
    }
    __syncthreads();
    for (int e = tid; e < ne; e += blockDim.x) {
        int run = 0;
        for (int w = 0; w < 32; ++w) {
            const int c = moe_wc[w * ne + e];
            moe_wc[w * ne + e] = run;
            run += c;
        }
        cnt[e] = run;
    }
    __syncthreads();
    if (warp == 0) {
        // offsets and first tiles: lane l takes experts [l·per, (l+1)·per), then a warp scan
        const int per = (ne + 31) / 32, e0 = min(ne, lane * per), e1 = min(ne, e0 + per);
        int c = 0, tc = 0;
        for (int e = e0; e < e1; ++e) {
            c += cnt[e];
            tc += (cnt[e] + bn - 1) / bn;
        }
        int ic = c, it = tc;
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, ic, d), yt = __shfl_up_sync(0xffffffffu, it, d);
            if (lane >= d) {
                ic += y;
                it += yt;
            }
        }
        int o = ic - c, t = it - tc;
        for (int e = e0; e < e1; ++e) {
            off[e] = o;
            toff[e] = t;
            o += cnt[e];
            t += (cnt[e] + bn - 1) / bn;
        }
        if (lane == 31) tiles[0] = (u32)it;
    }
    __syncthreads();
    for (int b = p0; b < p1; b += 32) {
        const int p = b + lane;
        const int e = p < p1 ? (int)ids[p] : -1;
        const u32 peers = __match_any_sync(0xffffffffu, e);
        if (e >= 0) {
            const int j = off[e] + wc[e] + __popc(peers & ((1u << lane) - 1u));
            sorted[j] = (u32)p;
            pos[p] = (u32)j;
        }
        __syncwarp();
        if (e >= 0 && lane == __ffs(peers) - 1) wc[e] += __popc(peers);
        __syncwarp();
    }
    for (int e = warp; e < ne; e += 32) {
        const int c = cnt[e];
        for (int t = lane; t * bn < c; t += 32) {
            u32* tp = tiles + 1 + 3 * (toff[e] + t);
            tp[0] = (u32)e;
            tp[1] = (u32)(off[e] + t * bn);
            tp[2] = (u32)min(bn, c - t * bn);
        }
    }
}

// The 8-bit activations of the pairs in sorted order: sorted row j takes source row
// src = sorted[j] / k of x's forms. kform: the q8_K form (K quants, K/256 scales, K/32 sums);
// else the q8_0 form (K quants, K/32 (d, s) pairs). grid (n_pairs), 256 threads.
extern "C" __global__ void moe_gather_q8(const u32* __restrict__ sorted, int k, int K, int kform,
                                         const i8* __restrict__ qs, const float* __restrict__ dk, const int* __restrict__ sk,
                                         const float2* __restrict__ ds0,
                                         i8* __restrict__ oqs, float* __restrict__ odk, int* __restrict__ osk, float2* __restrict__ ods0) {
    pdl_enter();
    const size_t j = blockIdx.x;
    const size_t src = sorted[j] / (u32)k;
    const int4* a = (const int4*)(qs + src * K);
    int4* b = (int4*)(oqs + j * K);
    for (int i = threadIdx.x; i < K / 16; i += blockDim.x) b[i] = a[i];
    if (kform) {
        for (int i = threadIdx.x; i < K / 256; i += blockDim.x) odk[j * (K / 256) + i] = dk[src * (K / 256) + i];
        for (int i = threadIdx.x; i < K / 32; i += blockDim.x) osk[j * (K / 32) + i] = sk[src * (K / 32) + i];
    } else {
        for (int i = threadIdx.x; i < K / 32; i += blockDim.x) ods0[j * (K / 32) + i] = ds0[src * (K / 32) + i];
    }
}
