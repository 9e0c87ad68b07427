// RMSNorm kernels (the row function and its arithmetic: norm.cuh). The fused variant also writes
// the row's 8-bit forms for the next matmul (see common.cuh): one trip through memory instead of
// two. One block per row.
#include "norm.cuh"

#define RMSNORM(MAXC)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(1024) rmsnorm_f32_q8_c##MAXC(                                       \
        const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, i8* qs0, float2* ds0,      \
        i8* qsk, float* dk, int* sk, int q8, int dim, float eps) {                                                    \
        pdl_enter();                                                                                                  \
        rmsnorm_row<MAXC, false>(x, w, out, Q8Out{qs0, ds0, qsk, dk, sk}, q8 != 0, dim, eps, blockIdx.x);           \
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
