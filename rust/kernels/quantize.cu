// Activation quantization: f32 → fak's q8_1 layout (see common.cuh), for a GEMV whose input was
// not produced by a fused producer (rmsnorm_f32_q8_1, swiglu_f32_q8_1).
#include "common.cuh"

// x: n values (n % 32 == 0). One warp per block of 32; grid-stride over blocks.
extern "C" __global__ void quantize_f32_q8_1(const float* __restrict__ x, i8* __restrict__ qs, float2* __restrict__ ds, int n) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int b = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < n / 32; b += warps) {
        quantize_block_q8_1(x[32 * b + lane], qs + 32 * b, ds + b, lane);
    }
}
