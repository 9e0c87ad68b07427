// Activation quantization: f32 → the 8-bit forms of common.cuh (q8_0 and q8_K, bit-exact with the
// CPU backend's quantizers), for a matmul whose input was not written by a fused producer
// (rmsnorm_f32_q8_c*, swiglu_f32_q8).
#include "common.cuh"

// x: n values (n % 32 == 0), flat, 16-byte aligned. One warp per chunk of 256 (the q8_K form for
// whole chunks), 8 consecutive values per lane.
extern "C" __global__ void quantize_f32_q8(const float* __restrict__ x, i8* qs0, float2* ds0, i8* qsk, float* dk, int* sk, int n) {
    pdl_enter();
    const Q8Out q{qs0, ds0, qsk, dk, sk};
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int c = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; 256 * c < n; c += warps) {
        const int c0 = 256 * c, nb = min(8, (n - c0) / 32);
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if ((lane >> 2) < nb) {
            const float4* p = (const float4*)(x + c0 + 8 * lane);
            const float4 a = p[0], b = p[1];
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        }
        quantize_chunk(v, nb, nb == 8, c0, q, lane);
    }
}
