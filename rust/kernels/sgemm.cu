// f32 weights times f32 activations on many rows: Y[r, o] = Σ_i W[o, i]·X[r, i] (+ bias[o])
// (+ Y[r, o] when accumulating), every product an f32 FMA (no f16 or tf32 rounding of either
// operand: a MoE router's top-k must not see it). The f32 GEMV (`mmv_f32_f32_c<NC>` in mmvq.cu)
// covers up to 8 rows; above, it ran in launches of 8 rows: an 8192-token prefill of the
// 30B-A3B twin spent 277 of its 697 ms in 48,128 such launches of its routers (H100, 2026-12-07).
//
// A plain tiled SIMT GEMM: a block of 256 threads computes a tile of 64 rows × 64 outputs, each
// thread 4 rows × 4 outputs (rows tr + 16·i, outputs tc + 16·j: a half-warp writes 16 adjacent
// outputs), over K in steps of 16 staged in shared memory, transposed so that the inner loop
// reads along the tile. Sums run along K in order for each output (k = 0, 1, …), so a row's
// result does not depend on the other rows of the launch. grid (⌈n_out/64⌉, ⌈n_rows/64⌉),
// 256 threads; K % 16 == 0.
#include "common.cuh"

#define SG_T 64
#define SG_K 16

extern "C" __global__ void __launch_bounds__(256) sgemm_f32(const float* __restrict__ W, const float* __restrict__ X,
                                                          const float* __restrict__ bias, float* __restrict__ Y, int K, int n_out,
                                                          int n_rows, int accumulate) {
    __shared__ float sx[SG_K][SG_T + 4];
    __shared__ float sw[SG_K][SG_T + 4];
    pdl_enter();
    const int tid = threadIdx.x, tr = tid >> 4, tc = tid & 15;
    const int r0 = blockIdx.y * SG_T, o0 = blockIdx.x * SG_T;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    // loads: thread (lr = tid / 16, lk = tid % 16) reads element lk of rows/outputs lr + 16·i
    const int lk = tid & 15, lr = tid >> 4;
    for (int k0 = 0; k0 < K; k0 += SG_K) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = r0 + lr + 16 * i, o = o0 + lr + 16 * i;
            sx[lk][lr + 16 * i] = r < n_rows ? X[(size_t)r * K + k0 + lk] : 0.0f;
            sw[lk][lr + 16 * i] = o < n_out ? W[(size_t)o * K + k0 + lk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < SG_K; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = sx[kk][tr + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = sw[kk][tc + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + tr + 16 * i;
        if (r >= n_rows) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int o = o0 + tc + 16 * j;
            if (o >= n_out) continue;
            float v = acc[i][j];
            if (bias) v += bias[o];
            float* y = Y + (size_t)r * n_out + o;
            *y = accumulate ? *y + v : v;
        }
    }
}
