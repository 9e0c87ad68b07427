// Quantized GEMM for prefill on tensor cores: Y[n, o] = Σ_k W[o, k]·X[n, k] (+ bias[o]) for many
// rows n. Each k-step of 32, a block dequantizes a 128×32 tile of W (any GGUF format, straight from
// its blocks) and converts a BN×32 tile of X (f32) to f16 in shared memory; eight warps multiply
// the tiles with mma.sync m16n8k16 (f16 inputs, f32 accumulators). Double-buffered shared memory,
// the next step's tiles are read from global memory while the current one is multiplied.
//
// Tiles: BM = 128 weight rows (M) × BN tokens (N, 64 or 128) × BK = 32. Warps 4 (M) × 2 (N), each
// 32 × BN/2. Requires K % 32 == 0.
#include "common.cuh"

// ---- raw fetch / decode of 16 consecutive weights of a row (k % 16 == 0) ----------------
// The GEMM fetches the raw words of its next k-step before multiplying the current one and
// decodes them after, so that global-memory latency hides behind the tensor-core work.

// Byte i (0..11) of three words (a runtime index without a local-memory array).
FAK_DEVICE int byte_of3(u32 a, u32 b, u32 c, int i) {
    const u32 w = i < 4 ? a : (i < 8 ? b : c);
    return (int)((w >> (8 * (i & 3))) & 0xFF);
}
FAK_DEVICE void k4_scale_min_r(u32 a, u32 b, u32 c, int j, int& sc, int& m) {
    if (j < 4) {
        sc = byte_of3(a, b, c, j) & 63;
        m = byte_of3(a, b, c, j + 4) & 63;
    } else {
        sc = (byte_of3(a, b, c, j + 4) & 0xF) | ((byte_of3(a, b, c, j - 4) >> 6) << 4);
        m = (byte_of3(a, b, c, j + 4) >> 4) | ((byte_of3(a, b, c, j) >> 6) << 4);
    }
}

template <int FMT> struct Raw16;

template <> struct Raw16<T_F32> {
    static constexpr int N = 16;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const uint4* p = (const uint4*)(row + 4 * (size_t)k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 v = p[i];
            r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
        }
    }
    static FAK_DEVICE void decode(const u32* r, int, float* out) {
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = __uint_as_float(r[i]);
    }
};
template <> struct Raw16<T_F16> {
    static constexpr int N = 8;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const uint4* p = (const uint4*)(row + 2 * (size_t)k);
        const uint4 a = p[0], b = p[1];
        r[0] = a.x; r[1] = a.y; r[2] = a.z; r[3] = a.w; r[4] = b.x; r[5] = b.y; r[6] = b.z; r[7] = b.w;
    }
    static FAK_DEVICE void decode(const u32* r, int, float* out) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            out[2 * i] = f16_lo(r[i]);
            out[2 * i + 1] = f16_hi(r[i]);
        }
    }
};
template <> struct Raw16<T_BF16> {
    static constexpr int N = 8;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) { Raw16<T_F16>::fetch(row, k, r); }
    static FAK_DEVICE void decode(const u32* r, int, float* out) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            out[2 * i] = __uint_as_float(r[i] << 16);
            out[2 * i + 1] = __uint_as_float(r[i] & 0xFFFF0000u);
        }
    }
};
// Q8_0 (34 B): d @0, qs @2.
template <> struct Raw16<T_Q8_0> {
    static constexpr int N = 5;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 34;
        r[0] = *(const u16*)b;
#pragma unroll
        for (int i = 0; i < 4; ++i) r[1 + i] = ld_u32_a2(b + 2 + (k & 31) + 4 * i);
    }
    static FAK_DEVICE void decode(const u32* r, int, float* out) {
        const float d = f16_to_f32((u16)r[0]);
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = (float)(i8)(r[1 + i / 4] >> (8 * (i & 3))) * d;
    }
};
// Q4_0 (18 B): d @0, qs[16] @2; the 16 values of a half-block are one nibble of all 16 bytes.
template <> struct Raw16<T_Q4_0> {
    static constexpr int N = 5;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 18;
        r[0] = *(const u16*)b;
#pragma unroll
        for (int i = 0; i < 4; ++i) r[1 + i] = ld_u32_a2(b + 2 + 4 * i);
    }
    static FAK_DEVICE void decode(const u32* r, int k, float* out) {
        const float d = f16_to_f32((u16)r[0]);
        const int sh = (k & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = (float)((int)((r[1 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) - 8) * d;
    }
};
// Q4_1 (20 B): d, m @0, qs @4.
template <> struct Raw16<T_Q4_1> {
    static constexpr int N = 5;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 20;
        r[0] = ld_u32(b);
#pragma unroll
        for (int i = 0; i < 4; ++i) r[1 + i] = ld_u32(b + 4 + 4 * i);
    }
    static FAK_DEVICE void decode(const u32* r, int k, float* out) {
        const float d = f16_lo(r[0]), m = f16_hi(r[0]);
        const int sh = (k & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = (float)((r[1 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) * d + m;
    }
};
// Q5_0 (22 B): d @0, qh @2, qs @6.
template <> struct Raw16<T_Q5_0> {
    static constexpr int N = 6;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 22;
        r[0] = *(const u16*)b;
        r[1] = ld_u32_a2(b + 2);
#pragma unroll
        for (int i = 0; i < 4; ++i) r[2 + i] = ld_u32_a2(b + 6 + 4 * i);
    }
    static FAK_DEVICE void decode(const u32* r, int k, float* out) {
        const float d = f16_to_f32((u16)r[0]);
        const int o = k & 16, sh = o ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int q = (int)(((r[2 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) | (((r[1] >> (o + i)) & 1) << 4));
            out[i] = (float)(q - 16) * d;
        }
    }
};
// Q5_1 (24 B): d, m @0, qh @4, qs @8.
template <> struct Raw16<T_Q5_1> {
    static constexpr int N = 6;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 24;
        r[0] = ld_u32(b);
        r[1] = ld_u32(b + 4);
#pragma unroll
        for (int i = 0; i < 4; ++i) r[2 + i] = ld_u32(b + 8 + 4 * i);
    }
    static FAK_DEVICE void decode(const u32* r, int k, float* out) {
        const float d = f16_lo(r[0]), m = f16_hi(r[0]);
        const int o = k & 16, sh = o ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 q = ((r[2 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) | (((r[1] >> (o + i)) & 1) << 4);
            out[i] = (float)q * d + m;
        }
    }
};
// Q4_K (144 B): dm @0, scales @4, qs @16; 16 values of sub-block j = 2p + hi at l0 = k & 16.
template <> struct Raw16<T_Q4_K> {
    static constexpr int N = 8;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 8) * 144;
        const int w = k & 255, p = w >> 6, l0 = w & 31;
        const uint4 h = *(const uint4*)b;
        r[0] = h.x; r[1] = h.y; r[2] = h.z; r[3] = h.w;
        const uint4 q = *(const uint4*)(b + 16 + 32 * p + l0);
        r[4] = q.x; r[5] = q.y; r[6] = q.z; r[7] = q.w;
    }
    static FAK_DEVICE void decode(const u32* r, int k, float* out) {
        const int w = k & 255, hi = (w >> 5) & 1, j = 2 * (w >> 6) + hi;
        int sc, m;
        k4_scale_min_r(r[1], r[2], r[3], j, sc, m);
        const float d = f16_lo(r[0]) * (float)sc, mn = f16_hi(r[0]) * (float)m;
        const int sh = 4 * hi;
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = d * (float)((r[4 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) - mn;
    }
};
// Q5_K (176 B): dm @0, scales @4, qh @16, qs @48.
template <> struct Raw16<T_Q5_K> {
    static constexpr int N = 12;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 8) * 176;
        const int w = k & 255, p = w >> 6, l0 = w & 31;
        const uint4 h = *(const uint4*)b;
        r[0] = h.x; r[1] = h.y; r[2] = h.z; r[3] = h.w;
        const uint4 q = *(const uint4*)(b + 48 + 32 * p + l0);
        r[4] = q.x; r[5] = q.y; r[6] = q.z; r[7] = q.w;
        const uint4 x = *(const uint4*)(b + 16 + l0);
        r[8] = x.x; r[9] = x.y; r[10] = x.z; r[11] = x.w;
    }
    static FAK_DEVICE void decode(const u32* r, int k, float* out) {
        const int w = k & 255, hi = (w >> 5) & 1, j = 2 * (w >> 6) + hi;
        int sc, m;
        k4_scale_min_r(r[1], r[2], r[3], j, sc, m);
        const float d = f16_lo(r[0]) * (float)sc, mn = f16_hi(r[0]) * (float)m;
        const int sh = 4 * hi;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 q = ((r[4 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) | (((r[8 + i / 4] >> (8 * (i & 3) + j)) & 1) << 4);
            out[i] = d * (float)q - mn;
        }
    }
};
// Q6_K (210 B): ql @0, qh @128, scales @192, d @208.
template <> struct Raw16<T_Q6_K> {
    static constexpr int N = 10;
    static FAK_DEVICE void fetch(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 8) * 210;
        const int w = k & 255, n = w >> 7, g = (w >> 5) & 3, l0 = w & 31;
        const u8* ql = b + 64 * n + 32 * (g & 1) + l0;
        const u8* qh = b + 128 + 32 * n + l0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r[i] = ld_u32_a2(ql + 4 * i);
            r[4 + i] = ld_u32_a2(qh + 4 * i);
        }
        r[8] = (u32)(int)(i8)b[192 + 8 * n + (l0 >> 4) + 2 * g];
        r[9] = *(const u16*)(b + 208);
    }
    static FAK_DEVICE void decode(const u32* r, int k, float* out) {
        const int g = (k >> 5) & 3, sl = 4 * (g >> 1), shh = 2 * g;
        const float d = f16_to_f32((u16)r[9]) * (float)(int)r[8];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int q = (int)(((r[i / 4] >> (8 * (i & 3) + sl)) & 0xF) | (((r[4 + i / 4] >> (8 * (i & 3) + shh)) & 3) << 4)) - 32;
            out[i] = d * (float)q;
        }
    }
};

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

    u32 raw[Raw16<FMT>::N];
    float4 xr[BV / 4];
    // Issue the global loads of step k0 (raw weight words, X as f32).
    auto fetch = [&](int k0) {
        Raw16<FMT>::fetch(a_ptr, k0 + a_col, raw);
#pragma unroll
        for (int i = 0; i < BV / 4; ++i) xr[i] = b_ok ? *(const float4*)(b_ptr + k0 + 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    // Decode step k0's weights, round both tiles to f16 and store them in buffer `buf`.
    auto store = [&](int k0, int buf) {
        float wv[16];
        Raw16<FMT>::decode(raw, k0 + a_col, wv);
        uint4* pa = (uint4*)(&sA[buf][a_row * LDS + a_col]);
        pa[0] = make_uint4(pack_f16x2(wv[0], wv[1]), pack_f16x2(wv[2], wv[3]), pack_f16x2(wv[4], wv[5]), pack_f16x2(wv[6], wv[7]));
        pa[1] = make_uint4(pack_f16x2(wv[8], wv[9]), pack_f16x2(wv[10], wv[11]), pack_f16x2(wv[12], wv[13]), pack_f16x2(wv[14], wv[15]));
        uint4* pb = (uint4*)(&sB[buf][b_row * LDS + b_col]);
#pragma unroll
        for (int i = 0; i < BV / 8; ++i)
            pb[i] = make_uint4(pack_f16x2(xr[2 * i].x, xr[2 * i].y), pack_f16x2(xr[2 * i].z, xr[2 * i].w),
                               pack_f16x2(xr[2 * i + 1].x, xr[2 * i + 1].y), pack_f16x2(xr[2 * i + 1].z, xr[2 * i + 1].w));
    };

    fetch(0);
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        store(k0, buf);
        __syncthreads();
        if (k0 + BK < K) fetch(k0 + BK);
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
