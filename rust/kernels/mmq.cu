// Quantized GEMM for prefill on tensor cores (two kernels; the first, f16, serves dense weights and
// FAK_CUDA_MMQ=f16; the CPU-faithful int8 one is at the end of the file): Y[n, o] = Σ_k W[o, k]·X[n, k] (+ bias[o]) for many
// rows n. Each k-step of 32, a block dequantizes a 128×32 tile of W (any GGUF format, straight from
// its blocks) and converts a BN×32 tile of X (f32) to f16 in shared memory; eight warps multiply
// the tiles with mma.sync m16n8k16 (f16 inputs, f32 accumulators). Double-buffered shared memory,
// the next step's tiles are read from global memory while the current one is multiplied.
//
// Tiles: BM = 128 weight rows (M) × BN tokens (N, 64 or 128) × BK = 32. Warps 4 (M) × 2 (N), each
// 32 × BN/2. Requires K % 32 == 0. With `accumulate` the epilogue adds into Y (the residual add).
#include "quants.cuh"

// Each k-step's 16 weights per thread come from Quant<FMT>::fetch16 (quants.cuh) before the
// current step is multiplied and are decoded (decode16) after it, so that global-memory latency
// hides behind the tensor-core work.

template <int FMT, int BN>
__device__ void mmq(const u8* __restrict__ W, size_t row_bytes, const float* __restrict__ X, const float* __restrict__ bias,
                    float* __restrict__ Y, int K, int n_out, int n_rows, bool accumulate) {
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

    u32 raw[Quant<FMT>::RAW16];
    float4 xr[BV / 4];
    // Issue the global loads of step k0 (raw weight words, X as f32).
    auto fetch = [&](int k0) {
        Quant<FMT>::fetch16(a_ptr, k0 + a_col, raw);
#pragma unroll
        for (int i = 0; i < BV / 4; ++i) xr[i] = b_ok ? *(const float4*)(b_ptr + k0 + 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    // Decode step k0's weights, round both tiles to f16 and store them in buffer `buf`.
    auto store = [&](int k0, int buf) {
        float wv[16];
        Quant<FMT>::decode16(raw, k0 + a_col, wv);
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
                if (n < n_rows) {
                    float* y = Y + (size_t)n * n_out + m;
                    const float v = acc[mi][nt][2 * e2] + bv;
                    *y = accumulate ? *y + v : v;
                }
                if (n + 1 < n_rows) {
                    float* y = Y + (size_t)(n + 1) * n_out + m;
                    const float v = acc[mi][nt][2 * e2 + 1] + bv;
                    *y = accumulate ? *y + v : v;
                }
            }
        }
    }
}

#define MMQ(NAME, FMT, BN)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 2) mmq_##NAME##_f16_n##BN(                                          \
        const u8* __restrict__ W, size_t row_bytes, const float* __restrict__ X, const float* __restrict__ bias,           \
        float* __restrict__ Y, int K, int n_out, int n_rows, int accumulate) {                                             \
        pdl_enter();                                                                                                       \
        mmq<FMT, BN>(W, row_bytes, X, bias, Y, K, n_out, n_rows, accumulate != 0);                                         \
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

// ================================================================================================
// The CPU-faithful quantized GEMM: Y[n, o] = Σ_k W[o, k]·X[n, k] (+ bias) (+ Y when accumulating)
// with X in the 8-bit form the CPU backend's matmul quantizes it to (common.cuh: q8_K for Q4_K/
// Q5_K/Q6_K, q8_0 for the legacy formats) and integer-exact sub-block dot products on the int8
// tensor cores (mma.sync m16n8k32 / m16n8k16 .s8, the approach of llama.cpp's mmq.cuh; the code is
// fak's own), scaled as ggml_vec_dot_* scales them:
//   legacy (block of 32 = one k-step):  (d_w·d_x)·Σq_w·q_x  (+ m_w·s_x for Q4_1/Q5_1);
//   Q4_K/Q5_K (super-block = 8 k-steps): (d_x·d)·Σ_j sc_j·dot_j − (d_x·dmin)·Σ_j m_j·bsum_j, both
//   sums integer over the whole super-block (the first in registers, the second from the mins
//   and token sums kept in shared memory) before the one float step;
//   Q6_K: (d_x·d)·Σ_i sc_i·dot_i over its 16 sub-blocks of 16 (two m16n8k16 per k-step).
// So CPU and GPU differ only in the order of f32 additions.
//
// Tile: BM = 128 weight rows × BN = 16, 32 or 64 tokens × BK = 32, 256 threads = 8 warps (4 along
// M × 2 along N, 32 × BN/2 each; the small BN serve batched decode, see the split-K note below). Shared rows are 48 bytes (32 int8 + pad: conflict-free fragment loads).
// Double-buffered: the next k-step's raw words are fetched into registers before the current
// step's MMAs and decoded to int8 after them.

// c (16x8 s32) += a (16x32 s8, row) · b (32x8 s8, col).
FAK_DEVICE void mma_s8_k32(int* c, const int* a, const int* b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// c (16x8 s32) += a (16x16 s8, row) · b (16x8 s8, col).
FAK_DEVICE void mma_s8_k16(int* c, int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// Split-K (batched decode, where the tiles alone are too few to fill the GPU): block z of a tile
// runs k-steps [z·kps, min((z+1)·kps, K/32)) — kps a multiple of 8, so a super-block never
// straddles two splits — and writes its partial sums to ws[z][n_rows][n_out]; the last of the
// tile's gridDim.z blocks to arrive (an arrival counter per tile, which it resets) adds the
// partials in split order, so the result does not depend on which block finishes last
// (the serial split-K fix-up of CUTLASS; the threadFenceReduction pattern of the CUDA samples).
//
// BN (tokens per tile) 16, 32 or 64: warps 4 (M) × 2 (N), each 32 × BN/2. G (1 or 2): k-steps
// per barrier — the raw words of G steps are fetched G steps ahead, decoded into G shared
// sub-buffers, and multiplied after one __syncthreads (a k-step of this kernel is a chain of
// dependent latencies: global load → shared store → barrier → fragment load → MMA; G = 2 runs
// two chains per barrier). The weight tiles (2·G·128·48 bytes) are dynamic shared memory
// (`mmq_q8_smem`); the rest is static. The order of the f32 additions does not depend on BN or G,
// only on the split count.
// Staged mode (S = 2 or 3 stages; batched decode, where a k-step chain that waits on global memory
// is what a product costs): the weights and activations of 256 values of K (8 k-steps: a
// super-block, or 8 legacy blocks) for the whole tile are copied to shared memory by cp.async, S − 1
// stages ahead of the one being multiplied, so that a block keeps whole super-blocks of loads in
// flight instead of one k-step's; the k-steps then read their raw words from shared memory
// (the same Quant<FMT>::fetch16, from a shared row) and go on as in the direct mode. Same numbers as the
// direct mode (the same words reach the same decode and MMAs). Needs K % 256 == 0 (the host
// falls back to the direct mode otherwise). Stage layout: the tile's BM rows at a stride of
// StageA::RS bytes (Q6_K rows are copied by 4-byte words from the aligned word below their start,
// which keeps their address mod 4, as its 210-byte blocks are 2-aligned), then BN tokens × 272
// bytes of quants, BN × stage_ya bytes of scales (q8_K: d; q8_0: 8 (d, s) pairs), and (Q4_K/Q5_K)
// BN × 32 bytes of the 8 block sums.
template <int FMT> struct StageA {
    static constexpr int BPS = FMT == T_Q4_0 ? 144 : FMT == T_Q4_1 ? 160 : FMT == T_Q5_0 ? 176 : FMT == T_Q5_1 ? 192
                             : FMT == T_Q8_0 ? 272 : FMT == T_Q4_K ? 144 : FMT == T_Q5_K ? 176 : 210;
    static constexpr bool W4 = FMT == T_Q6_K;
    static constexpr int RS = W4 ? 232 : (((BPS / 16) & 1) ? BPS : BPS + 16);
};
constexpr int STAGE_YQ = 272;
template <int FMT> __host__ __device__ constexpr int stage_ya() { return (FMT == T_Q4_K || FMT == T_Q5_K || FMT == T_Q6_K) ? 16 : 64; }
template <int FMT> __host__ __device__ constexpr int stage_ys() { return (FMT == T_Q4_K || FMT == T_Q5_K) ? 32 : 0; }
template <int FMT, int BN> __host__ __device__ constexpr int stage_bytes() { return 128 * StageA<FMT>::RS + BN * (STAGE_YQ + stage_ya<FMT>() + stage_ys<FMT>()); }

// cp.async of 16 / 4 bytes of which the first n are read (the rest zero-filled).
FAK_DEVICE void cp_async16z(void* smem, const void* gmem, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}
FAK_DEVICE void cp_async4z(void* smem, const void* gmem, int n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}

// Fragment mode (FR, Q4_K and Q6_K, on top of the staged copies): no decoded int8 tile and no
// barrier per k-step; each warp builds its MMA fragments straight from the stage's raw blocks in
// shared memory (the quants of its rows, the scales from the block header) and the tokens' quants,
// one barrier per stage of 8 k-steps. The same integer sub-block sums and the same f32 steps at
// each super-block's end as the other modes, so the same bits (the op tests compare them).
template <int FMT, int BN, int G, int S, bool FR = false>
__device__ void mmq_q8(const u8* __restrict__ W, size_t row_bytes, const i8* __restrict__ yq, const void* __restrict__ ya,
                       const int* __restrict__ ys, const float* __restrict__ bias, float* __restrict__ Y, int K, int n_out, int n_rows,
                       bool accumulate, int kps, float* __restrict__ ws, u32* __restrict__ counters, int n0_tok) {
    constexpr int BM = 128, AST = 48, NT = BN / 16;
    constexpr bool KQ = FMT == T_Q4_K || FMT == T_Q5_K;  // super-block sums with mins
    constexpr bool K6 = FMT == T_Q6_K;
    constexpr bool MIN1 = FMT == T_Q4_1 || FMT == T_Q5_1;  // + m_w·s_x per block
    extern __shared__ __align__(16) i8 mmq_dyn[];
    i8 (*sA)[G][BM * AST] = (i8 (*)[G][BM * AST])mmq_dyn;  // [2][G][BM·AST]
    static_assert(!FR || ((FMT == T_Q4_K || FMT == T_Q6_K) && S > 0), "fragment mode: Q4_K/Q6_K, staged");
    constexpr int TM = FR ? 1 : BM, TN = FR ? 1 : BN;  // the tiles below are unused in fragment mode
    __shared__ __align__(16) i8 sB[2][G][TN * AST];
    __shared__ int sRi[2][G][TM][2];    // integer row scales of the k-step (see Quant::decode16_i8)
    __shared__ float sRf[2][G][TM][2];  // float row scales
    __shared__ float sTd[2][G][TN];     // d_x of each token (its super-block / block)
    __shared__ int sTs[2][G][TN];       // Σq_x of the k-step's 32 (int; as f32 bits for the q8_0 form's s)
    // Q4_K/Q5_K: the 8 sub-block mins of each row and the 8 quant sums of each token of a
    // super-block, by super-block parity (read once at its end: Σ_j m_j·bsum_j).
    __shared__ __align__(16) int sMin[KQ && !FR ? 2 : 1][KQ && !FR ? BM : 1][8];
    __shared__ __align__(16) int sSum[KQ && !FR ? 2 : 1][KQ && !FR ? BN : 1][8];
    __shared__ u32 s_last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int m0 = blockIdx.x * BM, n0 = n0_tok;
    const int wm = (warp & 3) * 32, wn = (warp >> 2) * (BN / 2);

    // Loaders: weight row tid/2, 16 values at 16·(tid & 1); token tid/4 (those < BN), 8 bytes at
    // 8·(tid & 3).
    const int a_row = tid >> 1, a_h = tid & 1;
    const u8* a_ptr = W + (size_t)min(m0 + a_row, n_out - 1) * row_bytes;
    const int b_row = tid >> 2, b_part = tid & 3;
    const bool b_in = b_row < BN;
    const bool b_ok = b_in && n0 + b_row < n_rows;
    const size_t b_tok = (size_t)(b_ok ? n0 + b_row : 0);

    float acc[2][NT][4];
    int isum[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc[i][j][e] = 0.0f;
                isum[i][j][e] = 0;
            }

    // The raw words of one k-step, fetched ahead.
    struct Slot {
        u32 raw[Quant<FMT>::RAW16];
        uint2 bq;
        float td;
        int ts;
    };
    Slot sl[G];
    // The token operands of one k-step into slot s, from global or shared memory: its 8 quant
    // bytes at q, and d_x and the block sum (q8_K form: the float at d, the int at sum) or the
    // (d, scaled sum) pair at ds (q8_0 form); zeros for a token past the rows (ok false).
    auto fill_b = [&](Slot& s, bool ok, const i8* q, const float* d, const int* sum, const float2* ds) {
        if (!ok) {
            s.bq = make_uint2(0u, 0u);
            s.td = 0.0f;
            s.ts = 0;
            return;
        }
        s.bq = *(const uint2*)q;
        if (KQ || K6) {
            s.td = *d;
            s.ts = KQ ? *sum : 0;
        } else {
            s.td = ds->x;
            s.ts = __float_as_int(ds->y);
        }
    };
    auto fetch = [&](Slot& s, int k0) {
        Quant<FMT>::fetch16(a_ptr, k0 + 16 * a_h, s.raw);
        fill_b(s, b_ok, yq + b_tok * K + k0 + 8 * b_part, (const float*)ya + b_tok * (K / 256) + (k0 >> 8),
               KQ ? ys + b_tok * (K / 32) + (k0 >> 5) : nullptr, (const float2*)ya + b_tok * (K / 32) + (k0 >> 5));
    };
    // Decodes slot `s` (k-step at k0) into sub-buffer `sub` of shared buffer `buf`.
    auto store = [&](const Slot& s, int k0, int buf, int sub) {
        int q[4], si0, si1;
        float sf0, sf1;
        Quant<FMT>::decode16_i8(s.raw, k0 + 16 * a_h, q, si0, si1, sf0, sf1);
        *(int4*)(&sA[buf][sub][a_row * AST + 16 * a_h]) = make_int4(q[0], q[1], q[2], q[3]);
        if (K6) {
            sRi[buf][sub][a_row][a_h] = si0;  // each half has its own sub-block scale
            if (a_h == 0) sRf[buf][sub][a_row][0] = sf0;
        } else if (a_h == 0) {
            sRi[buf][sub][a_row][0] = si0;
            sRi[buf][sub][a_row][1] = si1;
            sRf[buf][sub][a_row][0] = sf0;
            sRf[buf][sub][a_row][1] = sf1;
        }
        if (b_in) {
            *(uint2*)(&sB[buf][sub][b_row * AST + 8 * b_part]) = s.bq;
            if (b_part == 0) {
                sTd[buf][sub][b_row] = s.td;
                sTs[buf][sub][b_row] = s.ts;
            }
        }
        if (KQ) {
            const int par = (k0 >> 8) & 1, j = (k0 >> 5) & 7;
            if (a_h == 0) sMin[par][a_row][j] = si1;
            if (b_in && b_part == 0) sSum[par][b_row][j] = s.ts;
        }
    };
    // Multiplies the k-step ks held in sub-buffer `sub` of buffer `buf`.
    auto compute = [&](int buf, int sub, int ks) {
        const int k0 = 32 * ks;
        const i8* A = sA[buf][sub];
        const i8* B = sB[buf][sub];
        int af[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const i8* ar = A + (wm + 16 * mi + g) * AST + 4 * tig;
            af[mi][0] = *(const int*)ar;
            af[mi][1] = *(const int*)(ar + 8 * AST);
            af[mi][2] = *(const int*)(ar + 16);
            af[mi][3] = *(const int*)(ar + 8 * AST + 16);
        }
        // Row scalars of the four rows this thread's accumulators belong to (those used every
        // k-step; the super-block's float scales are read at its end).
        int rsi[2][2][2];
        float rsf[2][2][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wm + 16 * mi + g + 8 * h;
                rsi[mi][h][0] = (KQ || K6) ? sRi[buf][sub][row][0] : 0;
                rsi[mi][h][1] = K6 ? sRi[buf][sub][row][1] : 0;
                rsf[mi][h][0] = (KQ || K6) ? 0.0f : sRf[buf][sub][row][0];
                rsf[mi][h][1] = MIN1 ? sRf[buf][sub][row][1] : 0.0f;
            }
        const bool sb_end = (KQ || K6) && ((ks & 7) == 7);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int col = wn + 8 * nt;
            const i8* br = B + (col + g) * AST + 4 * tig;
            const int bf[2] = {*(const int*)br, *(const int*)(br + 16)};
            const int c0 = col + 2 * tig;  // this thread's two columns: c0, c0 + 1
            const float tdv[2] = {sTd[buf][sub][c0], sTd[buf][sub][c0 + 1]};
            const int tsv[2] = {sTs[buf][sub][c0], sTs[buf][sub][c0 + 1]};
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                if (K6) {
                    int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                    mma_s8_k16(lo, af[mi][0], af[mi][1], bf[0]);
                    mma_s8_k16(hi, af[mi][2], af[mi][3], bf[1]);
#pragma unroll
                    for (int e = 0; e < 4; ++e) isum[mi][nt][e] += rsi[mi][e >> 1][0] * lo[e] + rsi[mi][e >> 1][1] * hi[e];
                } else {
                    int c[4] = {0, 0, 0, 0};
                    mma_s8_k32(c, af[mi], bf);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int h = e >> 1, cc = e & 1;
                        if (KQ) {
                            isum[mi][nt][e] += rsi[mi][h][0] * c[e];
                        } else {
                            float v = (rsf[mi][h][0] * tdv[cc]) * (float)c[e];
                            if (MIN1) v += rsf[mi][h][1] * __int_as_float(tsv[cc]);
                            acc[mi][nt][e] += v;
                        }
                    }
                }
                if (sb_end) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int h = e >> 1, cc = e & 1;
                        const int row = wm + 16 * mi + g + 8 * h;
                        float v = (tdv[cc] * sRf[buf][sub][row][0]) * (float)isum[mi][nt][e];
                        if (KQ) {
                            const int par = (k0 >> 8) & 1;
                            const int4* mr = (const int4*)sMin[par][row];
                            const int4* sr = (const int4*)sSum[par][c0 + cc];
                            const int4 ma = mr[0], mb = mr[1], sa = sr[0], sbv = sr[1];
                            const int ms = ma.x * sa.x + ma.y * sa.y + ma.z * sa.z + ma.w * sa.w + mb.x * sbv.x + mb.y * sbv.y + mb.z * sbv.z + mb.w * sbv.w;
                            v -= (tdv[cc] * sRf[buf][sub][row][1]) * (float)ms;
                        }
                        acc[mi][nt][e] += v;
                        isum[mi][nt][e] = 0;
                    }
                }
            }
        }
    };

    const int steps = K / 32;
    const int ks0 = blockIdx.z * kps, ks1 = min(steps, ks0 + kps);
    if constexpr (S == 0) {
#pragma unroll
        for (int d = 0; d < G; ++d)
            if (ks0 + d < ks1) fetch(sl[d], 32 * (ks0 + d));
        int buf = 0;
        for (int ks = ks0; ks < ks1; ks += G) {
#pragma unroll
            for (int d = 0; d < G; ++d)
                if (ks + d < ks1) store(sl[d], 32 * (ks + d), buf, d);
            __syncthreads();
#pragma unroll
            for (int d = 0; d < G; ++d)
                if (ks + G + d < ks1) fetch(sl[d], 32 * (ks + G + d));
#pragma unroll
            for (int d = 0; d < G; ++d)
                if (ks + d < ks1) compute(buf, d, ks + d);
            buf ^= 1;
        }
    } else {
        static_assert(8 % G == 0, "a stage holds whole k-step groups");
        constexpr int RS = StageA<FMT>::RS, SB = stage_bytes<FMT, BN>(), YA = stage_ya<FMT>();
        u8* const stages = (u8*)mmq_dyn + (FR ? 0 : 2 * G * BM * AST);
        // Copies stage st (values [256·st, 256·st + 256)) into stage buffer sb.
        auto issue = [&](int st, int sb) {
            u8* const sa = stages + sb * SB;
            if constexpr (!StageA<FMT>::W4) {
                constexpr int CPR = StageA<FMT>::BPS / 16;
                for (int c = tid; c < BM * CPR; c += 256) {
                    const int r = c / CPR, p = c - r * CPR;
                    const u8* src = W + (size_t)min(m0 + r, n_out - 1) * row_bytes + (size_t)st * StageA<FMT>::BPS + 16 * p;
                    cp_async16z(sa + r * RS + 16 * p, src, 16);
                }
            } else {
                // 53 words from the aligned word at or below the row's block; the last one holds
                // 2 (off 0) or 4 (off 2) of its bytes, so nothing past the block is read.
                for (int c = tid; c < BM * 53; c += 256) {
                    const int r = c / 53, wi = c - r * 53;
                    const size_t gb = (size_t)min(m0 + r, n_out - 1) * row_bytes + (size_t)st * 210;
                    const int off = (int)(gb & 3);
                    cp_async4z(sa + r * RS + 4 * wi, W + (gb - off) + 4 * wi, wi == 52 ? off + 2 : 4);
                }
            }
            u8* const sq = sa + BM * RS;
            for (int c = tid; c < BN * 16; c += 256) {
                const int r = c >> 4, p = c & 15, tok = n0 + r;
                const bool ok = tok < n_rows;
                cp_async16z(sq + r * STAGE_YQ + 16 * p, yq + (size_t)(ok ? tok : 0) * K + (size_t)st * 256 + 16 * p, ok ? 16 : 0);
            }
            u8* const sya = sq + BN * STAGE_YQ;
            if constexpr (KQ || K6) {
                for (int r = tid; r < BN; r += 256) {
                    const int tok = n0 + r;
                    const bool ok = tok < n_rows;
                    cp_async4z(sya + YA * r, (const float*)ya + (size_t)(ok ? tok : 0) * (K / 256) + st, ok ? 4 : 0);
                }
            } else {
                for (int c = tid; c < BN * 4; c += 256) {
                    const int r = c >> 2, p = c & 3, tok = n0 + r;
                    const bool ok = tok < n_rows;
                    cp_async16z(sya + YA * r + 16 * p, (const u8*)ya + ((size_t)(ok ? tok : 0) * (K / 32) + (size_t)st * 8) * 8 + 16 * p, ok ? 16 : 0);
                }
            }
            if constexpr (KQ) {
                u8* const sys = sya + BN * YA;
                for (int c = tid; c < BN * 2; c += 256) {
                    const int r = c >> 1, p = c & 1, tok = n0 + r;
                    const bool ok = tok < n_rows;
                    cp_async16z(sys + 32 * r + 16 * p, (const u8*)(ys + (size_t)(ok ? tok : 0) * (K / 32) + (size_t)st * 8) + 16 * p, ok ? 16 : 0);
                }
            }
        };
        // The slot of k-step kk / 32 of stage st, held in buffer sb, read from shared memory.
        auto fetch_s = [&](Slot& s, int sb, int st, int kk) {
            const u8* const sa = stages + sb * SB;
            int off = 0;
            if constexpr (StageA<FMT>::W4) off = (int)(((size_t)min(m0 + a_row, n_out - 1) * row_bytes + (size_t)st * 210) & 3);
            Quant<FMT>::fetch16(sa + a_row * RS + off, kk + 16 * a_h, s.raw);
            // Tokens past the rows are zero-filled stages; b_in only guards the loader threads.
            const u8* const sq = sa + BM * RS;
            const u8* const sya = sq + BN * STAGE_YQ + YA * b_row;
            fill_b(s, b_in, (const i8*)(sq + b_row * STAGE_YQ + kk + 8 * b_part), (const float*)sya,
                   (const int*)(sq + BN * STAGE_YQ + BN * YA + 32 * b_row) + (kk >> 5), (const float2*)sya + (kk >> 5));
        };
        const int st0 = ks0 >> 3, nst = (ks1 - ks0) >> 3;  // ks0, ks1: multiples of 8 (K % 256 == 0)
#pragma unroll
        for (int i = 0; i < S - 1; ++i) {
            if (i < nst) issue(st0 + i, i);
            cp_async_commit();
        }
        // Fragment mode: the 8 k-steps of stage st in buffer sb, straight from the raw blocks.
        auto compute_fr = [&](int sb, int st) {
            const u8* const sa = stages + sb * SB;
            const u8* const sq = sa + BM * RS;
            const u8* const sya = sq + BN * STAGE_YQ;
            // This thread's four rows (mi, h): row wm + 16·mi + g + 8·h.
            const u8* rp[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = wm + 16 * mi + g + 8 * h;
                    int off = 0;
                    if constexpr (K6) off = (int)(((size_t)min(m0 + row, n_out - 1) * row_bytes + (size_t)st * 210) & 3);
                    rp[mi][h] = sa + row * RS + off;
                }
            if constexpr (FMT == T_Q4_K) {
                u32 hd[2][2][4];  // each row's header words: (d, dmin), scales[0..11]
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint4 v = *(const uint4*)rp[mi][h];
                        hd[mi][h][0] = v.x; hd[mi][h][1] = v.y; hd[mi][h][2] = v.z; hd[mi][h][3] = v.w;
                    }
#pragma unroll
                for (int p = 0; p < 4; ++p) {
                    u32 qw[2][2][2];  // [mi][h][k half]: qs bytes 32p + 4·tig (+16)
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            qw[mi][h][0] = *(const u32*)(rp[mi][h] + 16 + 32 * p + 4 * tig);
                            qw[mi][h][1] = *(const u32*)(rp[mi][h] + 16 + 32 * p + 16 + 4 * tig);
                        }
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) {
                        const int j = 2 * p + hi;
                        int af[2][4], sc[2][2];
#pragma unroll
                        for (int mi = 0; mi < 2; ++mi) {
                            af[mi][0] = nib4(qw[mi][0][0], 4 * hi);
                            af[mi][1] = nib4(qw[mi][1][0], 4 * hi);
                            af[mi][2] = nib4(qw[mi][0][1], 4 * hi);
                            af[mi][3] = nib4(qw[mi][1][1], 4 * hi);
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                int m_unused;
                                k4_scale_min_r(hd[mi][h][1], hd[mi][h][2], hd[mi][h][3], j, sc[mi][h], m_unused);
                            }
                        }
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            const u8* br = sq + (wn + 8 * nt + g) * STAGE_YQ + 32 * j + 4 * tig;
                            const int bf[2] = {*(const int*)br, *(const int*)(br + 16)};
#pragma unroll
                            for (int mi = 0; mi < 2; ++mi) {
                                int c[4] = {0, 0, 0, 0};
                                mma_s8_k32(c, af[mi], bf);
#pragma unroll
                                for (int e = 0; e < 4; ++e) isum[mi][nt][e] += sc[mi][e >> 1] * c[e];
                            }
                        }
                    }
                }
                // The super-block's end: (d_x·d)·Σ sc·dot − (d_x·dmin)·Σ m·bsum.
                int mn[2][2][8];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            int sc_unused;
                            k4_scale_min_r(hd[mi][h][1], hd[mi][h][2], hd[mi][h][3], j, sc_unused, mn[mi][h][j]);
                        }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int c0 = wn + 8 * nt + 2 * tig;
#pragma unroll
                    for (int cc = 0; cc < 2; ++cc) {
                        const float td = *(const float*)(sya + YA * (c0 + cc));
                        const int4* sr = (const int4*)(sya + BN * YA + 32 * (c0 + cc));
                        const int4 sa4 = sr[0], sb4 = sr[1];
#pragma unroll
                        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int e = 2 * h + cc;
                                const int* m = mn[mi][h];
                                const int ms = m[0] * sa4.x + m[1] * sa4.y + m[2] * sa4.z + m[3] * sa4.w + m[4] * sb4.x + m[5] * sb4.y + m[6] * sb4.z + m[7] * sb4.w;
                                float v = (td * f16_lo(hd[mi][h][0])) * (float)isum[mi][nt][e];
                                v -= (td * f16_hi(hd[mi][h][0])) * (float)ms;
                                acc[mi][nt][e] += v;
                                isum[mi][nt][e] = 0;
                            }
                    }
                }
            } else {
                // Q6_K: ql @0, qh @128, scales @192 (int8 per 16 values), d @208; rows may start 2
                // bytes off a word (rp keeps the global address mod 4): words by two aligned loads.
                auto w32 = [](const u8* p) -> u32 {
                    const u32* q = (const u32*)((size_t)p & ~(size_t)3);
                    return __funnelshift_r(q[0], q[1], ((u32)(size_t)p & 3u) * 8u);
                };
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int n = j >> 2, gq = j & 3;
                    int af[2][4], sc[2][2][2];
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const u8* b = rp[mi][h];
#pragma unroll
                            for (int half = 0; half < 2; ++half) {
                                const u32 ql = w32(b + 64 * n + 32 * (gq & 1) + 16 * half + 4 * tig);
                                const u32 qh = w32(b + 128 + 32 * n + 16 * half + 4 * tig);
                                af[mi][h + 2 * half] = bytes_sub(nib4(ql, 4 * (gq >> 1)) | (int)(((qh >> (2 * gq)) & 0x03030303u) << 4), 0x20202020);
                                sc[mi][h][half] = (int)(i8)b[192 + 8 * n + 2 * gq + half];
                            }
                        }
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const u8* br = sq + (wn + 8 * nt + g) * STAGE_YQ + 32 * j + 4 * tig;
                        const int b0 = *(const int*)br, b1 = *(const int*)(br + 16);
#pragma unroll
                        for (int mi = 0; mi < 2; ++mi) {
                            int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                            mma_s8_k16(lo, af[mi][0], af[mi][1], b0);
                            mma_s8_k16(hi, af[mi][2], af[mi][3], b1);
#pragma unroll
                            for (int e = 0; e < 4; ++e) isum[mi][nt][e] += sc[mi][e >> 1][0] * lo[e] + sc[mi][e >> 1][1] * hi[e];
                        }
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int c0 = wn + 8 * nt + 2 * tig;
#pragma unroll
                    for (int cc = 0; cc < 2; ++cc) {
                        const float td = *(const float*)(sya + YA * (c0 + cc));
#pragma unroll
                        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int e = 2 * h + cc;
                                const float d = f16_to_f32(*(const u16*)(rp[mi][h] + 208));
                                acc[mi][nt][e] += (td * d) * (float)isum[mi][nt][e];
                                isum[mi][nt][e] = 0;
                            }
                    }
                }
            }
        };
        int buf = 0;
        for (int i = 0; i < nst; ++i) {
            cp_async_wait<S - 2>();
            __syncthreads();  // stage i landed for every thread; stage i − 1's buffer is free
            if (i + S - 1 < nst) issue(st0 + i + S - 1, (i + S - 1) % S);
            cp_async_commit();
            const int sb = i % S, st = st0 + i;
            if constexpr (FR) {
                compute_fr(sb, st);
                continue;
            }
#pragma unroll 1
            for (int j = 0; j < 8; j += G) {
#pragma unroll
                for (int d = 0; d < G; ++d) {
                    fetch_s(sl[d], sb, st, 32 * (j + d));
                    store(sl[d], 32 * (8 * st + j + d), buf, d);
                }
                __syncthreads();
#pragma unroll
                for (int d = 0; d < G; ++d) compute(buf, d, 8 * st + j + d);
                buf ^= 1;
            }
        }
    }

    const int splits = gridDim.z;
    if (splits > 1) {
        // This split's partial sums, then the tile's last block adds all of them.
        float* wz = ws + (size_t)blockIdx.z * n_rows * n_out;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + wm + 16 * mi + g + 8 * h;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int cc = 0; cc < 2; ++cc) {
                        const int n = n0 + wn + 8 * nt + 2 * tig + cc;
                        if (m < n_out && n < n_rows) wz[(size_t)n * n_out + m] = acc[mi][nt][2 * h + cc];
                    }
            }
        __threadfence();
        __syncthreads();
        u32* cnt = counters + blockIdx.y * gridDim.x + blockIdx.x;
        if (tid == 0) s_last = atomicAdd(cnt, 1u) == (u32)(splits - 1) ? 1u : 0u;
        __syncthreads();
        if (s_last == 0u) return;
        __threadfence();
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + wm + 16 * mi + g + 8 * h;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int cc = 0; cc < 2; ++cc) {
                        const int n = n0 + wn + 8 * nt + 2 * tig + cc;
                        if (m < n_out && n < n_rows) {
                            float v = 0.0f;
                            for (int z = 0; z < splits; ++z) v += __ldcg(ws + ((size_t)z * n_rows + n) * n_out + m);
                            acc[mi][nt][2 * h + cc] = v;
                        }
                    }
            }
        if (tid == 0) *cnt = 0u;
    }

#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + wm + 16 * mi + g + 8 * h;
            if (m >= n_out) continue;
            const float bv = bias ? bias[m] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int cc = 0; cc < 2; ++cc) {
                    const int n = n0 + wn + 8 * nt + 2 * tig + cc;
                    if (n < n_rows) {
                        float* y = Y + (size_t)n * n_out + m;
                        const float v = acc[mi][nt][2 * h + cc] + bv;
                        *y = accumulate ? *y + v : v;
                    }
                }
            }
        }
    }
}

// mmq_<fmt>_q8_n<BN>_p<G>: grid (⌈n_out/128⌉, ⌈n_rows/BN⌉, splits), 256 threads, dynamic shared
// memory 2·G·128·48 bytes (the host's `mmq_q8_smem`); `kps` k-steps of 32 per split; `ws`
// (splits·n_rows·n_out f32) and `counters` (one zeroed u32 per tile) only used when splits > 1.
#define MMQ_Q8(NAME, FMT, BN, G)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 2) mmq_##NAME##_q8_n##BN##_p##G(                                    \
        const u8* __restrict__ W, size_t row_bytes, const i8* __restrict__ yq, const void* __restrict__ ya,                \
        const int* __restrict__ ys, const float* __restrict__ bias, float* __restrict__ Y, int K, int n_out, int n_rows,   \
        int accumulate, int kps, float* __restrict__ ws, u32* __restrict__ counters) {                                     \
        pdl_enter();                                                                                                       \
        mmq_q8<FMT, BN, G, 0>(W, row_bytes, yq, ya, ys, bias, Y, K, n_out, n_rows, accumulate != 0, kps, ws, counters, blockIdx.y * BN);    \
    }
// mmq_<fmt>_q8_n<BN>_s<S>: the staged mode (two k-steps per barrier), dynamic shared memory
// 2·2·128·48 + S·stage_bytes (the host's `mmq_q8_smem`); K % 256 == 0.
#define MMQ_Q8S(NAME, FMT, BN, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 1) mmq_##NAME##_q8_n##BN##_s##S(                                    \
        const u8* __restrict__ W, size_t row_bytes, const i8* __restrict__ yq, const void* __restrict__ ya,                \
        const int* __restrict__ ys, const float* __restrict__ bias, float* __restrict__ Y, int K, int n_out, int n_rows,   \
        int accumulate, int kps, float* __restrict__ ws, u32* __restrict__ counters) {                                     \
        pdl_enter();                                                                                                       \
        mmq_q8<FMT, BN, 2, S>(W, row_bytes, yq, ya, ys, bias, Y, K, n_out, n_rows, accumulate != 0, kps, ws, counters, blockIdx.y * BN);    \
    }
// mmq_<fmt>_q8_n<BN>_f<S>: the fragment mode (Q4_K, Q6_K), dynamic shared memory S·stage_bytes.
#define MMQ_Q8F(NAME, FMT, BN, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 2) mmq_##NAME##_q8_n##BN##_f##S(                                    \
        const u8* __restrict__ W, size_t row_bytes, const i8* __restrict__ yq, const void* __restrict__ ya,                \
        const int* __restrict__ ys, const float* __restrict__ bias, float* __restrict__ Y, int K, int n_out, int n_rows,   \
        int accumulate, int kps, float* __restrict__ ws, u32* __restrict__ counters) {                                     \
        pdl_enter();                                                                                                       \
        mmq_q8<FMT, BN, 2, S, true>(W, row_bytes, yq, ya, ys, bias, Y, K, n_out, n_rows, accumulate != 0, kps, ws, counters, blockIdx.y * BN); \
    }
#define MMQ_Q8F_ALL(NAME, FMT)                                                                                             \
    MMQ_Q8F(NAME, FMT, 16, 2) MMQ_Q8F(NAME, FMT, 16, 3) MMQ_Q8F(NAME, FMT, 32, 2) MMQ_Q8F(NAME, FMT, 32, 3)             \
    MMQ_Q8F(NAME, FMT, 64, 2) MMQ_Q8F(NAME, FMT, 64, 3)
#define MMQ_Q8_ALL(NAME, FMT)                                                                                              \
    MMQ_Q8(NAME, FMT, 16, 1) MMQ_Q8(NAME, FMT, 16, 2) MMQ_Q8(NAME, FMT, 32, 1) MMQ_Q8(NAME, FMT, 32, 2)                   \
    MMQ_Q8(NAME, FMT, 64, 1) MMQ_Q8(NAME, FMT, 64, 2)                                                                     \
    MMQ_Q8S(NAME, FMT, 16, 2) MMQ_Q8S(NAME, FMT, 16, 3) MMQ_Q8S(NAME, FMT, 32, 2) MMQ_Q8S(NAME, FMT, 32, 3)             \
    MMQ_Q8S(NAME, FMT, 64, 2) MMQ_Q8S(NAME, FMT, 64, 3)
// mmq_id_<fmt>_q8_n<BN>_<p2|f2>: the grouped GEMM of a mixture-of-experts FFN over (row, expert)
// pairs in expert-sorted order (moe.cu `moe_sort`, `moe_gather_q8`): tile t = blockIdx.y of the
// tile table `tiles` (count, then (expert, first row, rows ≤ BN) per tile) multiplies expert e's
// matrix (W + e·estride) with rows first .. first + rows of the sorted activations into the same
// rows of Y. BN (16, 32, 64) is the host's choice by the pairs per expert (a 64-row tile holding
// the ≈ 4 pairs per expert of a 64-sequence decode step wasted 15/16 of its work); `p2` is the
// direct mode (two k-steps per barrier), `f2` the fragment mode over two staged super-blocks
// (Q4_K, Q6_K; K % 256 == 0), as the dense GEMM of prefill. Same bits in every variant: the f32
// additions' order depends on neither BN nor the mode. grid (⌈n_out/128⌉, an upper bound on the
// tiles), 256 threads, dynamic shared memory as mmq_<fmt>_q8_n<BN>_<mode>; blocks past the
// table's count return at once. No split-K, no bias.
template <int FMT, int BN, int S, bool FR>
__device__ void mmq_id(const u8* __restrict__ W, size_t row_bytes, size_t estride, const i8* __restrict__ yq, const void* __restrict__ ya,
                       const int* __restrict__ ys, float* __restrict__ Y, int K, int n_out, const u32* __restrict__ tiles) {
    pdl_enter();
    const u32 t = blockIdx.y;
    if (t >= tiles[0]) return;
    const u32 e = tiles[1 + 3 * t], first = tiles[2 + 3 * t], rows = tiles[3 + 3 * t];
    constexpr bool KF = FMT == T_Q4_K || FMT == T_Q5_K || FMT == T_Q6_K;
    const void* a = KF ? (const void*)((const float*)ya + (size_t)first * (K / 256)) : (const void*)((const float2*)ya + (size_t)first * (K / 32));
    const int* sm = ys ? ys + (size_t)first * (K / 32) : nullptr;
    mmq_q8<FMT, BN, 2, S, FR>(W + (size_t)e * estride, row_bytes, yq + (size_t)first * K, a, sm, nullptr, Y + (size_t)first * n_out, K, n_out,
                              (int)rows, false, K / 32, nullptr, nullptr, 0);
}
#define MMQ_ID(NAME, FMT, BN)                                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2) mmq_id_##NAME##_q8_n##BN##_p2(                                   \
        const u8* __restrict__ W, size_t row_bytes, size_t estride, const i8* __restrict__ yq, const void* __restrict__ ya, \
        const int* __restrict__ ys, float* __restrict__ Y, int K, int n_out, const u32* __restrict__ tiles) {              \
        mmq_id<FMT, BN, 0, false>(W, row_bytes, estride, yq, ya, ys, Y, K, n_out, tiles);                                  \
    }
#define MMQ_IDF(NAME, FMT, BN)                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, 2) mmq_id_##NAME##_q8_n##BN##_f2(                                   \
        const u8* __restrict__ W, size_t row_bytes, size_t estride, const i8* __restrict__ yq, const void* __restrict__ ya, \
        const int* __restrict__ ys, float* __restrict__ Y, int K, int n_out, const u32* __restrict__ tiles) {              \
        mmq_id<FMT, BN, 2, true>(W, row_bytes, estride, yq, ya, ys, Y, K, n_out, tiles);                                   \
    }
#define MMQ_ID_ALL(NAME, FMT) MMQ_ID(NAME, FMT, 16) MMQ_ID(NAME, FMT, 32) MMQ_ID(NAME, FMT, 64)
#define MMQ_IDF_ALL(NAME, FMT) MMQ_IDF(NAME, FMT, 16) MMQ_IDF(NAME, FMT, 32) MMQ_IDF(NAME, FMT, 64)
MMQ_ID_ALL(q4_0, T_Q4_0)
MMQ_ID_ALL(q4_1, T_Q4_1)
MMQ_ID_ALL(q5_0, T_Q5_0)
MMQ_ID_ALL(q5_1, T_Q5_1)
MMQ_ID_ALL(q8_0, T_Q8_0)
MMQ_ID_ALL(q4_K, T_Q4_K)
MMQ_ID_ALL(q5_K, T_Q5_K)
MMQ_ID_ALL(q6_K, T_Q6_K)
MMQ_IDF_ALL(q4_K, T_Q4_K)
MMQ_IDF_ALL(q6_K, T_Q6_K)

MMQ_Q8_ALL(q4_0, T_Q4_0)
MMQ_Q8_ALL(q4_1, T_Q4_1)
MMQ_Q8_ALL(q5_0, T_Q5_0)
MMQ_Q8_ALL(q5_1, T_Q5_1)
MMQ_Q8_ALL(q8_0, T_Q8_0)
MMQ_Q8_ALL(q4_K, T_Q4_K)
MMQ_Q8_ALL(q5_K, T_Q5_K)
MMQ_Q8_ALL(q6_K, T_Q6_K)
MMQ_Q8F_ALL(q4_K, T_Q4_K)
MMQ_Q8F_ALL(q6_K, T_Q6_K)
