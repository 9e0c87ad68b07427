// Quantized GEMM for prefill on tensor cores: Y[n, o] = Σ_k W[o, k]·X[n, k] (+ bias[o]) for many
// rows n. Each k-step of 32, a block dequantizes a 128×32 tile of W (any GGUF format, straight from
// its blocks) and converts a BN×32 tile of X (f32) to f16 in shared memory; eight warps multiply
// the tiles with mma.sync m16n8k16 (f16 inputs, f32 accumulators). Double-buffered shared memory,
// the next step's tiles are read from global memory while the current one is multiplied.
//
// Tiles: BM = 128 weight rows (M) × BN tokens (N, 64 or 128) × BK = 32. Warps 4 (M) × 2 (N), each
// 32 × BN/2. Requires K % 32 == 0.
#include "common.cuh"

template <int FMT, int BN>
__device__ void mmq(const u8* __restrict__ W, size_t row_bytes, const float* __restrict__ X, const float* __restrict__ bias,
                    float* __restrict__ Y, int K, int n_out, int n_rows) {
    constexpr int BM = 128, BK = 32, LDS = BK + 8;
    constexpr int NT = BN / 16;        // n8 tiles per warp
    constexpr int BV = BN / 8;         // X values per thread per step
    constexpr int BT = BK / BV;        // threads per X row
    __shared__ __align__(16) u16 sA[2][BM * LDS];
    __shared__ __align__(16) u16 sB[2][BN * LDS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int wm = (warp & 3) * 32, wn = (warp >> 2) * (BN / 2);

    // Loaders: A row tid/2 (16 values at column 16·(tid&1)); X row tid/BT (BV values).
    const int a_row = tid >> 1, a_col = (tid & 1) * 16;
    const u8* a_ptr = W + (size_t)min(m0 + a_row, n_out - 1) * row_bytes;
    const int b_row = tid / BT, b_col = (tid % BT) * BV;
    const bool b_ok = n0 + b_row < n_rows;
    const float* b_ptr = X + (size_t)(b_ok ? n0 + b_row : 0) * K + b_col;

    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    float wv[16], xv[BV];
    auto load = [&](int k0) {
        deq8<FMT>(a_ptr, k0 + a_col, wv);
        deq8<FMT>(a_ptr, k0 + a_col + 8, wv + 8);
#pragma unroll
        for (int i = 0; i < BV / 4; ++i) {
            const float4 v = b_ok ? *(const float4*)(b_ptr + k0 + 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            xv[4 * i] = v.x;
            xv[4 * i + 1] = v.y;
            xv[4 * i + 2] = v.z;
            xv[4 * i + 3] = v.w;
        }
    };
    auto store = [&](int buf) {
        uint4* pa = (uint4*)(&sA[buf][a_row * LDS + a_col]);
        pa[0] = make_uint4(pack_f16x2(wv[0], wv[1]), pack_f16x2(wv[2], wv[3]), pack_f16x2(wv[4], wv[5]), pack_f16x2(wv[6], wv[7]));
        pa[1] = make_uint4(pack_f16x2(wv[8], wv[9]), pack_f16x2(wv[10], wv[11]), pack_f16x2(wv[12], wv[13]), pack_f16x2(wv[14], wv[15]));
        uint4* pb = (uint4*)(&sB[buf][b_row * LDS + b_col]);
#pragma unroll
        for (int i = 0; i < BV / 8; ++i)
            pb[i] = make_uint4(pack_f16x2(xv[8 * i], xv[8 * i + 1]), pack_f16x2(xv[8 * i + 2], xv[8 * i + 3]),
                               pack_f16x2(xv[8 * i + 4], xv[8 * i + 5]), pack_f16x2(xv[8 * i + 6], xv[8 * i + 7]));
    };

    load(0);
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        store(buf);
        __syncthreads();
        if (k0 + BK < K) load(k0 + BK);
        const u16* A = sA[buf];
        const u16* B = sB[buf];
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            u32 af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(af[mi], A + (wm + mi * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nb = 0; nb < NT / 2; ++nb) {
                u32 bf[4];
                ldmatrix_x4(bf, B + (wn + nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    mma_f16(acc[mi][2 * nb], af[mi], bf);
                    mma_f16(acc[mi][2 * nb + 1], af[mi], bf + 2);
                }
            }
        }
        buf ^= 1;
    }

#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            const int m = m0 + wm + mi * 16 + (lane >> 2) + 8 * e2;
            if (m >= n_out) continue;
            const float bv = bias ? bias[m] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int n = n0 + wn + nt * 8 + (lane & 3) * 2;
                if (n < n_rows) Y[(size_t)n * n_out + m] = acc[mi][nt][2 * e2] + bv;
                if (n + 1 < n_rows) Y[(size_t)(n + 1) * n_out + m] = acc[mi][nt][2 * e2 + 1] + bv;
            }
        }
    }
}

#define MMQ(NAME, FMT, BN)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 2) mmq_##NAME##_f16_n##BN(                                          \
        const u8* __restrict__ W, size_t row_bytes, const float* __restrict__ X, const float* __restrict__ bias,           \
        float* __restrict__ Y, int K, int n_out, int n_rows) {                                                             \
        mmq<FMT, BN>(W, row_bytes, X, bias, Y, K, n_out, n_rows);                                                          \
    }
#define MMQ_BOTH(NAME, FMT) MMQ(NAME, FMT, 64) MMQ(NAME, FMT, 128)

MMQ_BOTH(q4_0, T_Q4_0)
MMQ_BOTH(q4_1, T_Q4_1)
MMQ_BOTH(q5_0, T_Q5_0)
MMQ_BOTH(q5_1, T_Q5_1)
MMQ_BOTH(q8_0, T_Q8_0)
MMQ_BOTH(q4_K, T_Q4_K)
MMQ_BOTH(q5_K, T_Q5_K)
MMQ_BOTH(q6_K, T_Q6_K)
MMQ_BOTH(f32, T_F32)
MMQ_BOTH(f16, T_F16)
MMQ_BOTH(bf16, T_BF16)
