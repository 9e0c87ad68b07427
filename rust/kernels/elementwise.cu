// Element-wise ops of the forward pass: residual add, SwiGLU (Shazeer 2020; silu(x) = x/(1+e^−x),
// as ggml's swiglu), the SwiGLU + q8_1 quantization fusion that feeds the down-projection GEMV,
// and the gather of the rows that need logits.
#include "common.cuh"

// x[i] += y[i], i < n. Vectorized by 4 when n % 4 == 0 (buffers are 256-byte aligned).
extern "C" __global__ void add_f32(float* __restrict__ x, const float* __restrict__ y, int n) {
    const int stride = gridDim.x * blockDim.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ((n & 3) == 0) {
        for (; i < n / 4; i += stride) {
            float4 a = ((float4*)x)[i];
            const float4 b = ((const float4*)y)[i];
            a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
            ((float4*)x)[i] = a;
        }
    } else {
        for (; i < n; i += stride) x[i] += y[i];
    }
}

FAK_DEVICE float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// gate[i] = silu(gate[i])·up[i], i < n.
extern "C" __global__ void swiglu_f32(float* __restrict__ gate, const float* __restrict__ up, int n) {
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) gate[i] = silu_mul(gate[i], up[i]);
}

// The same, also writing the result in q8_1 (n % 32 == 0). One warp per block of 32.
extern "C" __global__ void swiglu_f32_q8_1(float* __restrict__ gate, const float* __restrict__ up, i8* __restrict__ qs,
                                           float2* __restrict__ ds, int n) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int b = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < n / 32; b += warps) {
        const int i = 32 * b + lane;
        const float v = silu_mul(gate[i], up[i]);
        gate[i] = v;
        quantize_block_q8_1(v, qs + 32 * b, ds + b, lane);
    }
}

// out[j, :] = x[rows[j], :] for j < n (rows of dim). One block per output row.
extern "C" __global__ void gather_rows_f32(const float* __restrict__ x, const u32* __restrict__ rows, float* __restrict__ out, int dim) {
    const size_t j = blockIdx.x;
    const float* src = x + (size_t)rows[j] * dim;
    float* dst = out + j * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

// x[i] = v for i < n (test poisoning and zero-fills).
extern "C" __global__ void fill_f32(float* __restrict__ x, float v, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = v;
}
