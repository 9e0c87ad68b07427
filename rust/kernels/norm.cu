// RMSNorm (Zhang & Sennrich 2019) as ggml's rms_norm + mul: scale = 1/sqrt(mean(x²) + eps) in
// f32, out = (x·scale)·w. The fused variant also writes the row in fak's q8_1 layout for the
// next GEMV (one trip through memory instead of two).
#include "common.cuh"

// One block per row of `dim`. qs/ds may be null (no quantized copy); with them, dim % 32 == 0.
template <bool Q8>
__device__ void rmsnorm_row(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                            i8* __restrict__ qs, float2* __restrict__ ds, int dim, float eps) {
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float* xr = x + r * dim;
    float* orow = out + r * dim;
    float ss = 0.0f;
    if ((dim & 3) == 0) {
        for (int i = threadIdx.x; i < dim / 4; i += blockDim.x) {
            const float4 v = ((const float4*)xr)[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    }
    ss = block_sum(ss, sh);
    const float mean = ss / (float)dim;
    const float scale = 1.0f / sqrtf(mean + eps);
    if (!Q8) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = (xr[i] * scale) * w[i];
    } else {
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int b = threadIdx.x >> 5; b < dim / 32; b += nw) {
            const int i = 32 * b + lane;
            const float v = (xr[i] * scale) * w[i];
            orow[i] = v;
            quantize_block_q8_1(v, qs + r * dim + 32 * b, ds + r * (dim / 32) + b, lane);
        }
    }
}

// The fused variant for rows of ≤ 256 blocks of 32: 1024 threads, warp w takes blocks w, w + 32,
// ... (at most MAXB each); every value is loaded once into registers before the reduction, so the
// row costs one round of loads instead of two serial passes.
template <int MAXB>
__device__ void rmsnorm_q8_reg(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                               i8* __restrict__ qs, float2* __restrict__ ds, int dim, float eps) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const size_t r = blockIdx.x;
    const int nb = dim / 32;
    const float* xr = x + r * dim;
    float v[MAXB], wv[MAXB];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXB; ++k) {
        const int b = warp + k * nw;
        v[k] = b < nb ? xr[32 * b + lane] : 0.0f;
        wv[k] = b < nb ? w[32 * b + lane] : 0.0f;
        ss += v[k] * v[k];
    }
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < MAXB; ++k) {
        const int b = warp + k * nw;
        if (b < nb) {
            const float o = (v[k] * scale) * wv[k];
            out[r * dim + 32 * b + lane] = o;
            quantize_block_q8_1(o, qs + r * dim + 32 * b, ds + r * nb + b, lane);
        }
    }
}

#define RMSNORM_REG(MAXB)                                                                                             \
    extern "C" __global__ void __launch_bounds__(1024) rmsnorm_f32_q8_1_r##MAXB(                                     \
        const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, i8* __restrict__ qs,       \
        float2* __restrict__ ds, int dim, float eps) {                                                                \
        rmsnorm_q8_reg<MAXB>(x, w, out, qs, ds, dim, eps);                                                            \
    }
RMSNORM_REG(1)
RMSNORM_REG(2)
RMSNORM_REG(4)
RMSNORM_REG(8)

extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int dim, float eps) {
    rmsnorm_row<false>(x, w, out, nullptr, nullptr, dim, eps);
}

extern "C" __global__ void rmsnorm_f32_q8_1(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                            i8* __restrict__ qs, float2* __restrict__ ds, int dim, float eps) {
    rmsnorm_row<true>(x, w, out, qs, ds, dim, eps);
}
