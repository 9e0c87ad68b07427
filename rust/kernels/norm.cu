// RMSNorm (Zhang & Sennrich 2019) as fak's CPU backend computes it (rust/src/backend/cpu/norm.rs,
// ggml's rms_norm + mul): the squares x² in f32 summed in f64, mean = f32(sum/dim),
// scale = 1/sqrt(mean + eps) in f32, out = (x·scale)·w. The fused variant also writes the row's
// 8-bit forms for the next matmul (see common.cuh): one trip through memory instead of two.
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
    return sh[0];
}

// One block per row of `dim` (dim % 32 == 0 when quantizing). Warp w holds chunks w, w + nw, ...
// (at most MAXC, 256 values each; lane l holds values 8l .. 8l + 7 of a chunk) in registers.
// q8: write the q8_0 form, and the q8_K form when dim % 256 == 0.
template <int MAXC>
__device__ void rmsnorm_reg(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, Q8Out q, bool q8,
                            int dim, float eps) {
    __shared__ double sh[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const size_t r = blockIdx.x;
    const float* xr = x + r * dim;
    float v[MAXC][8];
    double ss = 0.0;
#pragma unroll
    for (int c = 0; c < MAXC; ++c) {
        const int c0 = 256 * (warp + c * nw);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int i = c0 + 8 * lane + j;
            v[c][j] = i < dim ? xr[i] : 0.0f;
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

#define RMSNORM(MAXC)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(1024) rmsnorm_f32_q8_c##MAXC(                                       \
        const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, i8* qs0, float2* ds0,      \
        i8* qsk, float* dk, int* sk, int q8, int dim, float eps) {                                                    \
        pdl_enter();                                                                                                  \
        rmsnorm_reg<MAXC>(x, w, out, Q8Out{qs0, ds0, qsk, dk, sk}, q8 != 0, dim, eps);                              \
    }
RMSNORM(1)
RMSNORM(2)
RMSNORM(4)

// Any `dim`, no quantized copy: one block per row, two passes.
extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int dim, float eps) {
    pdl_enter();
    __shared__ double sh[32];
    const size_t r = blockIdx.x;
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)(xr[i] * xr[i]);
    const float mean = (float)(block_sum_d(ss, sh) / (double)dim);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = (xr[i] * scale) * w[i];
}
