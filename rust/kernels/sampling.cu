// Sampling on the device: per-row argmax (greedy; ties → lowest index, NaN never wins, as the CPU
// backend's argmax), and per-row max + log-sum-exp so that a greedy token's log-probability
// (logit − lse) needs no copy of the logits to the host.
#include "common.cuh"

FAK_DEVICE void better(float& bv, u32& bi, float v, u32 i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// The warp's best (value, lowest index), in every lane.
FAK_DEVICE void warp_argmax(float& bv, u32& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(bv, bi, ov, oi);
    }
}

// The block's best (value, lowest index), in every thread (sv, si: 32 entries of shared memory;
// every thread must call it).
FAK_DEVICE void block_argmax(float& bv, u32& bi, float* sv, u32* si) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_argmax(bv, bi);
    if (lane == 0) {
        sv[wid] = bv;
        si[wid] = bi;
    }
    __syncthreads();
    bv = lane < nw ? sv[lane] : NEG_INF;
    bi = lane < nw ? si[lane] : 0xffffffffu;
    warp_argmax(bv, bi);
}

// One block (≤ 1024 threads, multiple of 32) per row of n_cols.
// idx[r] = argmax; when stats != null, stats[r] = (max, log Σ e^(x − max) + max).
extern "C" __global__ void argmax_f32(const float* __restrict__ x, int n_cols, u32* __restrict__ idx, float2* __restrict__ stats) {
    pdl_enter();
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ float sh[32];
    const float* row = x + (size_t)blockIdx.x * n_cols;
    float bv = -__int_as_float(0x7f800000);
    u32 bi = 0xffffffffu;
    for (int i = threadIdx.x; i < n_cols; i += blockDim.x) better(bv, bi, row[i], (u32)i);
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) idx[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
    if (stats) {
        const float m = bv;  // every thread holds the row max now
        float s = 0.0f;
        if (m > -__int_as_float(0x7f800000)) {
            for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
                const float v = row[i];
                if (v == v) s += expf(v - m);
            }
        }
        s = block_sum(s, sh);
        if (threadIdx.x == 0) stats[blockIdx.x] = make_float2(m, logf(s) + m);
    }
}

// The greedy step on the device: idx[r] = argmax of row r (as argmax_f32) and logprob[r] = its
// log-softmax, −ln Σ e^(x − max) with the sum in f64 (as the CPU backend's greedy_row), so that a
// greedy decode step copies back two numbers per row instead of the row of logits. Two launches
// so that the whole GPU reads the logits (one block per row took ~90 µs for 151,936 columns):
// greedy_partial_f32, grid (G, rows): block g takes the g-th slice of its row and writes its best
// (value, lowest index) and s_g = Σ_slice e^(x − m_g) (f64) around its own max m_g;
// greedy_final_f32, one warp per row: the best of the G partials (value, then lowest index),
// Σ_g s_g·e^(m_g − m) in f64, logprob = −ln of that.
struct GreedyPart {
    float m;
    u32 i;
    double s;
};

extern "C" __global__ void greedy_partial_f32(const float* __restrict__ x, int n_cols, GreedyPart* __restrict__ part) {
    pdl_enter();
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ double sd[32];
    const int G = gridDim.x, g = blockIdx.x;
    const int per = (n_cols + G - 1) / G;
    const int lo = g * per, hi = min(n_cols, lo + per);
    const float* row = x + (size_t)blockIdx.y * n_cols;
    float bv = NEG_INF;
    u32 bi = 0xffffffffu;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) better(bv, bi, row[i], (u32)i);
    block_argmax(bv, bi, sv, si);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float m = bv;  // every thread holds the slice's max now
    double s = 0.0;
    if (m > NEG_INF) {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float v = row[i];
            if (v == v) s += (double)expf(v - m);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) sd[wid] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < nw; ++w) t += sd[w];
        part[(size_t)blockIdx.y * G + g] = GreedyPart{m, bi, t};
    }
}

// One warp (32 threads) per row; G partials per row.
extern "C" __global__ void greedy_final_f32(const GreedyPart* __restrict__ part, int G, u32* __restrict__ idx, float* __restrict__ logprob) {
    pdl_enter();
    const int lane = threadIdx.x;
    const GreedyPart* p = part + (size_t)blockIdx.x * G;
    float bv = NEG_INF;
    u32 bi = 0xffffffffu;
    for (int g = lane; g < G; g += 32) better(bv, bi, p[g].m, p[g].i);
    warp_argmax(bv, bi);
    double t = 0.0;
    if (bv > NEG_INF) {
        for (int g = lane; g < G; g += 32)
            if (p[g].m > NEG_INF) t += p[g].s * exp((double)p[g].m - (double)bv);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (lane == 0) {
        idx[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
        logprob[blockIdx.x] = t > 0.0 ? -(float)log(t) : 0.0f;
    }
}

// ---- sampling on the device (the engine's `device_sample`): candidates, penalties, the draw ----
//
// The host sampler's semantics (engine/sampler) split so that only small things cross the bus:
// top_rows_f32 gives each row's exact top m (sorted as the host sorts: value descending in IEEE
// total order, ties lower id first) and its (max, Σ e^(x − max)), from which the host finishes
// greedy, top-k, top-p and min-p itself over ≤ m candidates; penalize_f32 applies the sparse
// penalties in place; draw_f32 draws from the whole vocabulary at a temperature with the uniform
// the host's generator gave.

// Larger key ⇔ later in IEEE totalOrder (Rust's f32::total_cmp); key_value inverts it.
FAK_DEVICE u32 order_key(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
FAK_DEVICE float key_value(u32 k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

FAK_DEVICE float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : NEG_INF;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

FAK_DEVICE double block_sum_f64(double v, double* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < nw; ++w) t += sh[w];
    return t;
}

#define TOP_CAP 2048

// One block of 1024 threads per selected row (`rows[blockIdx.x]`), 1 ≤ m ≤ min(n_cols, 1024).
// A radix select (four 8-bit passes from the top) finds the m-th largest key T; the keys above T
// and those equal to it are gathered into shared memory (up to TOP_CAP: exact[r] = 0 when the
// ties at T overflow it, so the lowest ids among them are not known), bitonic-sorted as
// (key, ~id) descending, and the first m written to ids/vals[r·m ..]. stats[r] = (max, Σ e^(x −
// max) in f64) with max the largest non-NaN value, as the CPU's log_normalizer.
extern "C" __global__ void top_rows_f32(const float* __restrict__ x, int n_cols, const u32* __restrict__ rows, int m,
                                        u32* __restrict__ ids, float* __restrict__ vals, double* __restrict__ z, float* __restrict__ maxv,
                                        u32* __restrict__ exact) {
    pdl_enter();
    __shared__ u32 hist[256];
    __shared__ unsigned long long cand[TOP_CAP];
    __shared__ u32 s_prefix, s_rank, s_ngt, s_neq;
    __shared__ float sf[32];
    __shared__ double sd[32];
    const float* row = x + (size_t)rows[blockIdx.x] * n_cols;
    const int tid = threadIdx.x, B = blockDim.x;
    if (tid == 0) {
        s_prefix = 0;
        s_rank = (u32)m;
        s_ngt = 0;
        s_neq = 0;
    }
    float mx = NEG_INF;
    u32 mask = 0;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        for (int i = tid; i < 256; i += B) hist[i] = 0;
        __syncthreads();
        const u32 prefix = s_prefix;
        for (int i = tid; i < n_cols; i += B) {
            const float v = row[i];
            if (pass == 0) mx = fmaxf(mx, v);
            const u32 k = order_key(v);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            // the bin holding the s_rank-th largest key among those matching the prefix
            u32 r = s_rank, cum = 0;
            int b = 255;
            for (; b > 0; --b) {
                if (cum + hist[b] >= r) break;
                cum += hist[b];
            }
            s_rank = r - cum;
            s_prefix = prefix | ((u32)b << shift);
        }
        mask |= 0xffu << shift;
        __syncthreads();
    }
    mx = block_max(mx, sf);
    const u32 T = s_prefix;
    const u32 need_eq = s_rank;         // ties at T the top m takes
    const u32 n_gt = (u32)m - need_eq;  // keys above T
    double s = 0.0;
    for (int i = tid; i < n_cols; i += B) {
        const float v = row[i];
        s += (double)expf(v - mx);
        const u32 k = order_key(v);
        if (k > T) {
            const u32 slot = atomicAdd(&s_ngt, 1u);
            cand[slot] = ((unsigned long long)k << 32) | (u32)~(u32)i;
        } else if (k == T) {
            const u32 slot = n_gt + atomicAdd(&s_neq, 1u);
            if (slot < TOP_CAP) cand[slot] = ((unsigned long long)k << 32) | (u32)~(u32)i;
        }
    }
    s = block_sum_f64(s, sd);
    __syncthreads();
    const u32 filled = min((u32)TOP_CAP, n_gt + s_neq);
    u32 n_sort = 32;
    while (n_sort < filled) n_sort <<= 1;
    for (u32 i = filled + tid; i < n_sort; i += B) cand[i] = 0ull;
    __syncthreads();
    // bitonic sort, descending
    for (u32 k = 2; k <= n_sort; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 i = tid; i < n_sort; i += B) {
                const u32 l = i ^ j;
                if (l > i) {
                    const unsigned long long a = cand[i], b = cand[l];
                    const bool desc = (i & k) == 0;
                    if (desc ? (a < b) : (a > b)) {
                        cand[i] = b;
                        cand[l] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    const size_t o = (size_t)blockIdx.x * m;
    for (int i = tid; i < m; i += B) {
        const unsigned long long c = cand[i];
        ids[o + i] = ~(u32)(c & 0xffffffffu);
        vals[o + i] = key_value((u32)(c >> 32));
    }
    if (tid == 0) {
        z[blockIdx.x] = s;
        maxv[blockIdx.x] = mx;
        exact[blockIdx.x] = (n_gt + s_neq) <= TOP_CAP ? 1u : 0u;
    }
}

// A penalty on one logit (engine/sampler's penalty entries): v ← (v ≤ 0 ? v·repeat : v/repeat) −
// delta, IEEE-rounded as the CPU (repeat 1 and delta 0 leave v unchanged). raw[j] = v before.
struct LogitPenalty {
    u32 row;
    u32 token;
    float repeat;
    float delta;
};

extern "C" __global__ void penalize_f32(float* __restrict__ x, int n_cols, const LogitPenalty* __restrict__ e, int n, float* __restrict__ raw) {
    pdl_enter();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const LogitPenalty p = e[j];
    float* at = x + (size_t)p.row * n_cols + p.token;
    float v = *at;
    raw[j] = v;
    v = v <= 0.0f ? __fmul_rn(v, p.repeat) : __fdiv_rn(v, p.repeat);
    *at = __fsub_rn(v, p.delta);
}

// One draw from a whole row at a temperature (the host's `draw`): w_i = e^((x_i − M)·inv_t) with M
// the row's largest non-NaN value, target = u·Σw, the token is the first i (index order) whose
// running sum of positive weights passes the target, else the last positive one. Two launches, so
// that the whole GPU reads a row (one block per row cost ~0.15 ms for 151,936 columns):
// draw_partial_f32, grid (G, draws): block g takes the g-th slice of its row and writes its max
// m_g, Σ e^(x − m_g) (T = 1, f64: the log-normalizer), Σ e^((x − m_g)·inv_t) (f64) and its last
// positive index; draw_final_f32, one block per draw: M = max m_g, the slices' weight sums
// rescaled to M and laid end to end (one thread, in order, so they tile [0, Σ)), the slice
// holding the target walked by the whole block with the exact weights (a block scan per 1024
// columns). Out: the token, its logit, M and Σ e^(x − M) (the host's log_normalizer, for the
// log-probability without another pass).
struct DrawRequest {
    u32 row;
    float inv_t;
    double u;
};

struct DrawPart {
    float m;
    u32 last;  // last index with a positive weight, 0xffffffff: none
    double s1;
    double sw;
};

extern "C" __global__ void draw_partial_f32(const float* __restrict__ x, int n_cols, const DrawRequest* __restrict__ d, DrawPart* __restrict__ part) {
    pdl_enter();
    __shared__ float sf[32];
    __shared__ double sd[32];
    __shared__ u32 s_last;
    const int G = gridDim.x, g = blockIdx.x;
    const DrawRequest q = d[blockIdx.y];
    const float* row = x + (size_t)q.row * n_cols;
    const int per = (n_cols + G - 1) / G;
    const int lo = min(n_cols, g * per), hi = min(n_cols, lo + per);
    if (threadIdx.x == 0) s_last = 0;  // last positive index + 1; 0: none
    float m = NEG_INF;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m, sf);
    double s1 = 0.0, sw = 0.0;
    u32 last = 0;
    bool any = false;
    if (m > NEG_INF) {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float v = row[i];
            s1 += (double)expf(v - m);
            const float w = expf((v - m) * q.inv_t);
            if (w > 0.0f) {
                sw += (double)w;
                last = (u32)i;
                any = true;
            }
        }
    }
    if (any) atomicMax(&s_last, last + 1u);
    s1 = block_sum_f64(s1, sd);
    __syncthreads();
    sw = block_sum_f64(sw, sd);
    if (threadIdx.x == 0) part[(size_t)blockIdx.y * G + g] = DrawPart{m, s_last == 0 ? 0xffffffffu : s_last - 1u, s1, sw};
}

extern "C" __global__ void draw_final_f32(const float* __restrict__ x, int n_cols, const DrawRequest* __restrict__ d, const DrawPart* __restrict__ part, int G,
                                          u32* __restrict__ tok, float* __restrict__ val, float* __restrict__ maxv, double* __restrict__ z) {
    pdl_enter();
    __shared__ double sd[32];
    __shared__ double s_from, s_target;
    __shared__ int s_slice;
    __shared__ u32 s_found, s_last;
    __shared__ float s_m;
    const DrawRequest q = d[blockIdx.x];
    const float* row = x + (size_t)q.row * n_cols;
    const DrawPart* p = part + (size_t)blockIdx.x * G;
    const int tid = threadIdx.x, B = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = B >> 5;
    if (tid == 0) {
        float M = NEG_INF;
        for (int g = 0; g < G; ++g) M = fmaxf(M, p[g].m);
        double z1 = 0.0, total = 0.0;
        u32 last = 0;
        for (int g = 0; g < G; ++g) {
            if (p[g].m > NEG_INF) {
                z1 += p[g].s1 * exp((double)p[g].m - (double)M);
                total += p[g].sw * exp(((double)p[g].m - (double)M) * (double)q.inv_t);
            }
            if (p[g].last != 0xffffffffu) last = p[g].last;
        }
        const double target = q.u * total;
        // the slice whose interval [from, from + sw_g) holds the target, summed in the same order
        double from = 0.0;
        int slice = -1;
        for (int g = 0; g < G && slice < 0; ++g) {
            const double sg = p[g].m > NEG_INF ? p[g].sw * exp(((double)p[g].m - (double)M) * (double)q.inv_t) : 0.0;
            if (sg > 0.0 && from <= target && target < from + sg) slice = g;
            else from += sg;
        }
        s_m = M;
        s_from = from;
        s_target = target;
        s_slice = slice;
        s_last = last;
        s_found = 0xffffffffu;
        maxv[blockIdx.x] = M;
        z[blockIdx.x] = z1;
    }
    __syncthreads();
    const int slice = s_slice;
    if (slice >= 0) {
        const float M = s_m;
        const double target = s_target;
        const int per = (n_cols + G - 1) / G;
        const int lo = min(n_cols, slice * per), hi = min(n_cols, lo + per);
        double run = s_from;
        for (int base = lo; base < hi; base += B) {
            const int i = base + tid;
            float w = i < hi ? expf((row[i] - M) * q.inv_t) : 0.0f;
            if (!(w > 0.0f)) w = 0.0f;
            // inclusive block scan of the weights (f64)
            double iw = (double)w;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const double t = __shfl_up_sync(0xffffffffu, iw, o);
                if (lane >= o) iw += t;
            }
            __syncthreads();
            if (lane == 31) sd[wid] = iw;
            __syncthreads();
            double before = 0.0, chunk = 0.0;
            for (int k = 0; k < nw; ++k) {
                if (k == wid) before = chunk;
                chunk += sd[k];
            }
            if (w > 0.0f && run + before + iw > target) atomicMin(&s_found, (u32)i);
            __syncthreads();
            if (s_found != 0xffffffffu) break;
            run += chunk;
        }
        // rounding kept the walk below the target: the slice's last positive weight
        if (tid == 0 && s_found == 0xffffffffu) s_found = p[slice].last;
        __syncthreads();
    }
    if (tid == 0) {
        const u32 t = s_found != 0xffffffffu ? s_found : (s_last != 0xffffffffu ? s_last : 0u);
        tok[blockIdx.x] = t;
        val[blockIdx.x] = row[t];
    }
}
