// RMSNorm of one row held in registers (Zhang & Sennrich 2019) as fak's CPU backend computes it
// (rust/src/backend/cpu/norm.rs, ggml's rms_norm + mul): the squares x² in f32 summed in f64,
// mean = f32(sum/dim), scale = 1/sqrt(mean + eps) in f32, out = (x·scale)·w; optionally also the
// row's 8-bit forms for the next matmul (see common.cuh). Shared by the norm kernels (norm.cu) and
// the GEMV whose last block normalizes the rows it completed (mmvq.cu).
#pragma once
#include "common.cuh"

FAK_DEVICE double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The sum of every thread's `v` over the block, returned to all threads (sh: 32 doubles of
// shared memory; every thread must call it).
FAK_DEVICE double block_sum_d(double v, double* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double t = lane < nw ? sh[lane] : 0.0;
        t = warp_sum_d(t);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    const double s = sh[0];
    __syncthreads();  // sh may be reused by the caller's next row
    return s;
}

// Row r of `dim` values of x (every thread of the block calls it; dim % 32 == 0 when quantizing).
// Warp w holds chunks w, w + nw, ... (at most MAXC, 256 values each; lane l holds values
// 8l .. 8l + 7 of a chunk) in registers. q8: write the q8_0 form, and the q8_K form when
// dim % 256 == 0. CG: read x through L2 only (__ldcg), for rows other blocks of the same grid
// have just written.
template <int MAXC, bool CG>
__device__ void rmsnorm_row(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, Q8Out q, bool q8,
                            int dim, float eps, size_t r) {
    __shared__ double sh[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float* xr = x + r * dim;
    float v[MAXC][8];
    double ss = 0.0;
#pragma unroll
    for (int c = 0; c < MAXC; ++c) {
        const int c0 = 256 * (warp + c * nw);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int i = c0 + 8 * lane + j;
            v[c][j] = i < dim ? (CG ? __ldcg(xr + i) : xr[i]) : 0.0f;
            ss += (double)(v[c][j] * v[c][j]);
        }
    }
    const float mean = (float)(block_sum_d(ss, sh) / (double)dim);
    const float scale = 1.0f / sqrtf(mean + eps);
    const bool with_k = q8 && dim % 256 == 0;
#pragma unroll
    for (int c = 0; c < MAXC; ++c) {
        const int c0 = 256 * (warp + c * nw);
        if (c0 >= dim) break;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int i = c0 + 8 * lane + j;
            if (i < dim) {
                v[c][j] = (v[c][j] * scale) * w[i];
                out[r * dim + i] = v[c][j];
            } else {
                v[c][j] = 0.0f;
            }
        }
        if (q8) quantize_chunk(v[c], min(8, (dim - c0) / 32), with_k, r * dim + c0, q, lane);
    }
}

// rmsnorm_row for a row the block does not hold: two passes over x through L2 (__ldcg: the row
// was just written by other blocks of the grid), 8 values per lane at a time, so that the
// kernel it ends (a GEMV, norm_after in mmvq.cu) keeps its register budget. The squares are
// summed in the order rmsnorm_row sums them for the same number of warps.
FAK_DEVICE void rmsnorm_row_l2(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, Q8Out q, bool q8,
                               int dim, float eps, size_t r) {
    __shared__ double sh[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int c0 = 256 * warp; c0 < dim; c0 += 256 * nw) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int i = c0 + 8 * lane + j;
            const float v = i < dim ? __ldcg(xr + i) : 0.0f;
            ss += (double)(v * v);
        }
    }
    const float mean = (float)(block_sum_d(ss, sh) / (double)dim);
    const float scale = 1.0f / sqrtf(mean + eps);
    const bool with_k = q8 && dim % 256 == 0;
    for (int c0 = 256 * warp; c0 < dim; c0 += 256 * nw) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int i = c0 + 8 * lane + j;
            if (i < dim) {
                v[j] = (__ldcg(xr + i) * scale) * w[i];
                out[r * dim + i] = v[j];
            } else {
                v[j] = 0.0f;
            }
        }
        if (q8) quantize_chunk(v, min(8, (dim - c0) / 32), with_k, r * dim + c0, q, lane);
    }
}
