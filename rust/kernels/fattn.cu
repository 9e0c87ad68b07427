// Fused causal attention over the paged f16 KV cache (FlashAttention-2, Dao 2023: online softmax,
// S = QKᵀ and O = PV on tensor cores with mma.sync m16n8k16, P kept in registers), for prefill
// and decode rows alike, with grouped-query attention and a split of long KV ranges across blocks
// (flash-decoding, Dao et al. 2023) whose partial results the last block to finish combines.
//
// Work: a "pair" is (query row, query head) of one sequence; the G = n_head/n_head_kv query heads of
// a KV head form consecutive pairs p = row·G + head, so one KV tile in shared memory serves all of
// them. A block of NW warps takes P = 16·NW consecutive pairs of one sequence and one KV head; warp
// w owns pairs 16w..16w+15 (the M dimension of its MMAs). Pair p attends to positions
// lo(p) .. n_past + p/G (causal), lo(p) = 0, or with a sliding window W > 0 (`window`)
// max(0, n_past + p/G + 1 − W): llama.cpp's LLAMA_SWA_TYPE_STANDARD, key j seen iff pos − j < W.
// grid = (n_seqs · tiles_per_seq, n_head_kv, n_split); KV split z covers positions
// [base + z·sl, base + (z+1)·sl) (sl: kv_split_len), base = lo(first pair of the block) rounded
// down to a tile (0 without a window): blocks of the table before base are never read (the engine may
// have released them), and the window start is derived in the kernel from n_past, so a decode
// graph captured once stays valid as sequences advance.
//
// KV layout per layer: [block][kv_head][32 slots][D] f16 (block size 32 = one tile). Scores are
// f32; Q and P are rounded to f16 for the MMAs (as llama.cpp's CUDA flash attention).
#include "common.cuh"

// Positions per KV split: `split_len` when > 0 (prefill: one split; FAK_CUDA_ATTN_SPLIT=capacity:
// the batch's context capacity over the launch's splits), else (decode) the block's own range
// `span` over the n_split splits of the launch, in whole tiles and at least two, so that every
// split of a short context in a long-capacity batch has work. The combine derives the same.
FAK_DEVICE int kv_split_len(int split_len, int span, int n_split) {
    if (split_len > 0) return split_len;
    return max(64, ((span + n_split - 1) / n_split + 31) & ~31);
}

template <int D, int NW>
__device__ void fattn(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
                      const SeqRows* __restrict__ seqs, const u32* __restrict__ tables, float* __restrict__ out,
                      float* ws_o, float2* ws_ml, u32* counters, int n_head, int n_head_kv, int tiles_per_seq,
                      int split_len, float scale_log2, int ext_combine, int window) {
    constexpr int P = 16 * NW, LD = D + 8, NTH = 32 * NW, BS = 32;
    // Q's A fragments (D/2 registers per thread) stay in shared memory beside the K/V tiles
    // when D > 128: the O accumulator alone takes D/2 f32 per thread.
    constexpr bool QS = D > 128;
    extern __shared__ __align__(16) u16 smem[];
    __shared__ u32 s_last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int seq_i = blockIdx.x / tiles_per_seq, tile = blockIdx.x - seq_i * tiles_per_seq;
    const int g = blockIdx.y, split = blockIdx.z, n_split = gridDim.z;
    const SeqRows s = seqs[seq_i];
    const int G = n_head / n_head_kv;
    const int n_pairs = (int)s.n_rows * G;
    const int pair0 = tile * P;
    if (pair0 >= n_pairs) return;  // the same for every split of this (x, y): no counter involved
    const int p_last = min(pair0 + P, n_pairs) - 1;
    const int L_max = (int)s.n_past + p_last / G + 1;
    // The tile where the first pair's window starts (pairs are in position order).
    const int kv_base = window > 0 ? max(0, (int)s.n_past + pair0 / G + 1 - window) & ~(BS - 1) : 0;
    // Splits that hold positions of this block's pairs; the others have nothing to do (and are
    // not counted by the combine).
    const int sl = kv_split_len(split_len, L_max - kv_base, n_split);
    const int n_valid = min(n_split, (L_max - kv_base + sl - 1) / sl);
    if (split >= n_valid) return;
    const int kv_lo = kv_base + split * sl;
    const int kv_hi = min(kv_lo + sl, L_max);
    const size_t qstride = (size_t)n_head * D;

    // This thread's two rows of the warp's 16 pairs: keys [Fa, La) and [Fb, Lb).
    const int pa = pair0 + warp * 16 + (lane >> 2), pb = pa + 8;
    const int La = pa < n_pairs ? (int)s.n_past + pa / G + 1 : 0;
    const int Lb = pb < n_pairs ? (int)s.n_past + pb / G + 1 : 0;
    const int Fa = window > 0 ? max(0, La - window) : 0;
    const int Fb = window > 0 ? max(0, Lb - window) : 0;

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    if (kv_lo < kv_hi) {
        // Q (f32) → f16 in shared memory → A fragments in registers, or (QS) read from there
        // at each k-step.
        u16* sQ = smem;
        for (int i = threadIdx.x; i < P * (D / 4); i += NTH) {
            const int pi = i / (D / 4), d4 = i - pi * (D / 4);
            const int p = pair0 + pi;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (p < n_pairs) {
                const int r = p / G, h = g * G + (p - r * G);
                v = *(const float4*)(q + (size_t)(s.row0 + r) * qstride + (size_t)h * D + 4 * d4);
            }
            *(uint2*)(sQ + pi * LD + 4 * d4) = make_uint2(pack_f16x2(v.x, v.y), pack_f16x2(v.z, v.w));
        }
        __syncthreads();
        u32 qf[QS ? 1 : D / 16][4];
        if constexpr (!QS) {
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(qf[ks], sQ + (warp * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8);
            __syncthreads();  // K/V overwrite Q
        }

        u16* sK = smem + (QS ? P * LD : 0);  // [2][BS][LD]
        u16* sV = sK + 2 * BS * LD;          // [2][BS][LD]
        const int t_lo = kv_lo / BS, t_hi = (kv_hi + BS - 1) / BS;
        auto issue = [&](int t, int buf) {
            const u32 blk = tables[s.table0 + t];
            const size_t base = ((size_t)blk * n_head_kv + g) * BS * D;
            for (int i = threadIdx.x; i < BS * (D / 8); i += NTH) {
                const int tok = i / (D / 8), c = i - tok * (D / 8);
                cp_async16(sK + (buf * BS + tok) * LD + 8 * c, kc + base + tok * D + 8 * c);
                cp_async16(sV + (buf * BS + tok) * LD + 8 * c, vc + base + tok * D + 8 * c);
            }
            cp_async_commit();
        };
        issue(t_lo, 0);
        for (int t = t_lo; t < t_hi; ++t) {
            const int buf = (t - t_lo) & 1;
            if (t + 1 < t_hi) {
                issue(t + 1, buf ^ 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const u16* kt = sK + buf * BS * LD;
            const u16* vt = sV + buf * BS * LD;
            const int pos0 = t * BS;
            if (pos0 + BS > kv_hi) {
                // Slots past the range may hold stale values (even inf): P is 0 there, and 0·inf
                // would be NaN, so clear them.
                for (int i = threadIdx.x; i < (pos0 + BS - kv_hi) * (D / 2); i += NTH) {
                    const int tok = kv_hi - pos0 + i / (D / 2), c = i % (D / 2);
                    *(u32*)(sV + (buf * BS + tok) * LD + 2 * c) = 0u;
                }
                __syncthreads();
            }

            // S = Q Kᵀ: 16 pairs × 32 positions per warp.
            float sc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) {
                u32 qs[4];
                if constexpr (QS) ldmatrix_x4(qs, sQ + (warp * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8);
                const u32* a = QS ? qs : qf[QS ? 0 : ks];
#pragma unroll
                for (int nb = 0; nb < 2; ++nb) {
                    u32 b[4];
                    ldmatrix_x4(b, kt + (nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + ks * 16 + ((lane >> 3) & 1) * 8);
                    mma_f16(sc[2 * nb], a, b);
                    mma_f16(sc[2 * nb + 1], a, b + 2);
                }
            }
            // Causal (and window) mask and scale (log2 domain), online softmax. Slots of the tile
            // before a row's window start hold the sequence's own earlier keys (finite): P is 0.
            const int lim_a = min(La, kv_hi), lim_b = min(Lb, kv_hi);
            float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int pos = pos0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                    const bool in = e < 2 ? (pos >= Fa && pos < lim_a) : (pos >= Fb && pos < lim_b);
                    const float v = in ? sc[nt][e] * scale_log2 : NEG_INF;
                    sc[nt][e] = v;
                    if (e < 2) mx0 = fmaxf(mx0, v);
                    else mx1 = fmaxf(mx1, v);
                }
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            const float a0 = mn0 == NEG_INF ? 1.0f : ex2(m0 - mn0);
            const float a1 = mn1 == NEG_INF ? 1.0f : ex2(m1 - mn1);
            m0 = mn0;
            m1 = mn1;
            float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float mn = e < 2 ? mn0 : mn1;
                    const float p = mn == NEG_INF ? 0.0f : ex2(sc[nt][e] - mn);
                    sc[nt][e] = p;
                    if (e < 2) rs0 += p;
                    else rs1 += p;
                }
            }
            l0 = l0 * a0 + rs0;
            l1 = l1 * a1 + rs1;
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                o[i][0] *= a0;
                o[i][1] *= a0;
                o[i][2] *= a1;
                o[i][3] *= a1;
            }
            // O += P V.
#pragma unroll
            for (int kc2 = 0; kc2 < 2; ++kc2) {
                u32 a[4] = {pack_f16x2(sc[2 * kc2][0], sc[2 * kc2][1]), pack_f16x2(sc[2 * kc2][2], sc[2 * kc2][3]),
                            pack_f16x2(sc[2 * kc2 + 1][0], sc[2 * kc2 + 1][1]), pack_f16x2(sc[2 * kc2 + 1][2], sc[2 * kc2 + 1][3])};
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    u32 b[4];
                    ldmatrix_x4_trans(b, vt + (kc2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
                    mma_f16(o[2 * dp], a, b);
                    mma_f16(o[2 * dp + 1], a, b + 2);
                }
            }
            __syncthreads();
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int dcol = (lane & 3) * 2;

    if (n_valid == 1) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int p = half ? pb : pa;
            if (p >= n_pairs) continue;
            const float l = half ? l1 : l0;
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            const int r = p / G, h = g * G + (p - r * G);
            float* dst = out + (size_t)(s.row0 + r) * qstride + (size_t)h * D + dcol;
#pragma unroll
            for (int i = 0; i < D / 8; ++i) *(float2*)(dst + 8 * i) = make_float2(o[i][2 * half] * inv, o[i][2 * half + 1] * inv);
        }
        return;
    }

    // Partial results of this split: (m, l) and the unnormalized O of each pair.
    const size_t base = ((size_t)blockIdx.x * n_head_kv + g) * n_split;
    const int pl_a = warp * 16 + (lane >> 2);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int pl = pl_a + 8 * half;
        const size_t rec = (base + split) * P + pl;
        const float m = half ? m1 : m0;
        if ((lane & 3) == 0) ws_ml[rec] = make_float2(m, half ? l1 : l0);
        // Written also when the pair saw no key here (O is then 0), so a combine may weight it
        // by 0 without a branch.
#pragma unroll
        for (int i = 0; i < D / 8; ++i) *(float2*)(ws_o + rec * D + 8 * i + dcol) = make_float2(o[i][2 * half], o[i][2 * half + 1]);
    }
    if (ext_combine) return;  // fattn_combine_f32 runs next
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[blockIdx.x * n_head_kv + g], 1u) == (u32)(n_valid - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // The last block combines: per pair, weights w_z = 2^(m_z − M) (one warp per pair, into
    // shared memory), then every thread sums its (pair, 4 dims) over the splits.
    float* sw = (float*)smem;        // [P][n_valid]
    float* sinv = sw + P * n_valid;  // [P]
    for (int pl = warp; pl < P; pl += NW) {
        if (pair0 + pl >= n_pairs) continue;
        float M = NEG_INF;
        for (int z = lane; z < n_valid; z += 32) M = fmaxf(M, __ldcg(&ws_ml[(base + z) * P + pl]).x);
        M = warp_max(M);
        float L = 0.0f;
        for (int z = lane; z < n_valid; z += 32) {
            const float2 ml = __ldcg(&ws_ml[(base + z) * P + pl]);
            const float w = ml.x == NEG_INF ? 0.0f : ex2(ml.x - M);
            sw[pl * n_valid + z] = w;
            L += ml.y * w;
        }
        L = warp_sum(L);
        if (lane == 0) sinv[pl] = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < P * (D / 4); i += NTH) {
        const int pl = i / (D / 4), d4 = i - pl * (D / 4);
        const int p = pair0 + pl;
        if (p >= n_pairs) continue;
        const float* wz = sw + pl * n_valid;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int z = 0; z < n_valid; ++z) {
            const float w = wz[z];
            if (w == 0.0f) continue;  // no keys in that split: its O was never written
            const float4 v = __ldcg((const float4*)(ws_o + ((base + z) * P + pl) * D) + d4);
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        const float inv = sinv[pl];
        const int r = p / G, h = g * G + (p - r * G);
        *(float4*)(out + (size_t)(s.row0 + r) * qstride + (size_t)h * D + 4 * d4) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    }
    if (threadIdx.x == 0) counters[blockIdx.x * n_head_kv + g] = 0u;
}

// Combine of the split decode attention (every sequence has one row): block (sequence, query
// head), 256 threads. Weights w_z = 2^(m_z − M) of the valid splits, then thread (z-group, 4
// dims) sums its share of the splits and the groups are added in shared memory. Splits: at most
// 128 (the host's cap), counted from the split kernel's base (its sliding window's first tile).
// Sequences whose context fits one split were written by the split kernel.
extern "C" __global__ void __launch_bounds__(256) fattn_combine_f32(const SeqRows* __restrict__ seqs, const float* __restrict__ ws_o,
                                                                    const float2* __restrict__ ws_ml, float* __restrict__ out, int n_head,
                                                                    int n_head_kv, int n_split, int split_len, int P, int D, int window) {
    pdl_enter();
    __shared__ float sw[128];
    __shared__ float sh[32];
    __shared__ float4 sacc[256];
    const SeqRows s = seqs[blockIdx.x];
    const int h = blockIdx.y, G = n_head / n_head_kv, g = h / G, pl = h - g * G;
    const int L = (int)s.n_past + 1;
    const int kv_base = window > 0 ? max(0, L - window) & ~31 : 0;
    const int sl = kv_split_len(split_len, L - kv_base, n_split);
    const int n_valid = min(n_split, (L - kv_base + sl - 1) / sl);
    if (n_valid <= 1) return;
    const size_t base = ((size_t)blockIdx.x * n_head_kv + g) * n_split;
    const int tid = threadIdx.x;
    float2 ml = make_float2(NEG_INF, 0.0f);
    if (tid < n_valid) ml = __ldcg(&ws_ml[(base + tid) * P + pl]);
    // Block maximum of m (NEG_INF-safe).
    float M = warp_max(ml.x);
    __syncthreads();
    if ((tid & 31) == 0) sh[tid >> 5] = M;
    __syncthreads();
    M = (tid & 31) < (int)(blockDim.x >> 5) ? sh[tid & 31] : NEG_INF;
    M = warp_max(M);
    const float w = (tid < n_valid && ml.x != NEG_INF) ? ex2(ml.x - M) : 0.0f;
    if (tid < n_valid) sw[tid] = w;
    const float Lsum = block_sum(ml.y * w, sh);
    __syncthreads();
    const int dv = D / 4, zg = tid / dv, d4 = tid - zg * dv, ngr = blockDim.x / dv;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (zg < ngr) {
#pragma unroll 4
        for (int z = zg; z < n_valid; z += ngr) {
            const float wz = sw[z];
            const float4 v = __ldcg((const float4*)(ws_o + ((base + z) * P + pl) * D) + d4);
            acc.x += wz * v.x;
            acc.y += wz * v.y;
            acc.z += wz * v.z;
            acc.w += wz * v.w;
        }
        sacc[tid] = acc;
    }
    __syncthreads();
    if (zg == 0) {
        for (int i = 1; i < ngr; ++i) {
            const float4 b = sacc[i * dv + d4];
            acc.x += b.x;
            acc.y += b.y;
            acc.z += b.z;
            acc.w += b.w;
        }
        const float inv = Lsum > 0.0f ? 1.0f / Lsum : 0.0f;
        *(float4*)(out + (size_t)s.row0 * n_head * D + (size_t)h * D + 4 * d4) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    }
}

#define FATTN(D, NW)                                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * NW) fattn_f16_d##D##_w##NW(                                          \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc, const SeqRows* __restrict__ seqs, \
        const u32* __restrict__ tables, float* __restrict__ out, float* ws_o, float2* ws_ml, u32* counters, int n_head,      \
        int n_head_kv, int tiles_per_seq, int split_len, float scale_log2, int ext_combine, int window) {                    \
        pdl_enter();                                                                                                         \
        fattn<D, NW>(q, kc, vc, seqs, tables, out, ws_o, ws_ml, counters, n_head, n_head_kv, tiles_per_seq, split_len,        \
                     scale_log2, ext_combine, window);                                                                       \
    }

FATTN(64, 1)
FATTN(64, 2)
FATTN(64, 4)
FATTN(128, 1)
FATTN(128, 2)
FATTN(128, 4)
FATTN(16, 1)
FATTN(16, 2)
FATTN(16, 4)
FATTN(32, 1)
FATTN(32, 2)
FATTN(32, 4)
FATTN(80, 1)
FATTN(80, 2)
FATTN(80, 4)
FATTN(96, 1)
FATTN(96, 2)
FATTN(96, 4)
FATTN(256, 1)
FATTN(256, 2)
FATTN(256, 4)
