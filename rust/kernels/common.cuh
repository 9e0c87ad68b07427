// fak CUDA kernels: definitions shared by every kernel family.
//
// Self-contained on purpose (no CUDA or C++ headers): build.rs inlines this file into each family,
// and the same text compiles with nvcc (FAK_CUDA_ARCH builds) and with NVRTC at start-up.
//
// Block formats follow ggml (`ggml-common.h`, `ggml-quants.c` dequantize_row_*): offsets below are
// in bytes from the start of a block. Blocks of 18/22/34/210 bytes are only 2-byte aligned, so
// their 32-bit words are read as two 16-bit loads.
#pragma once

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define FAK_DEVICE __device__ __forceinline__
#define WARP 32

// ggml type ids (ggml.h `enum ggml_type`).
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

// ---- scalar conversions -------------------------------------------------------------------

FAK_DEVICE float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
FAK_DEVICE u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
FAK_DEVICE float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }
// Two floats rounded to f16 and packed: `lo` in bits 0..15, `hi` in bits 16..31.
FAK_DEVICE u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// Low and high f16 halves of a 32-bit word as floats.
FAK_DEVICE float f16_lo(u32 w) { return f16_to_f32((u16)(w & 0xFFFF)); }
FAK_DEVICE float f16_hi(u32 w) { return f16_to_f32((u16)(w >> 16)); }

// Four signed bytes dot four signed bytes, plus c (dp4a, sm_61+).
FAK_DEVICE int dp4a(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// Per-byte `x - k` for bytes x in [0, 128) and k ≤ x + 128 (bias each byte by 128 so no borrow
// crosses a byte, subtract, remove the bias): the result bytes are two's-complement int8.
FAK_DEVICE int bytes_sub(int x, int k4) { return (int)((((u32)x | 0x80808080u) - (u32)k4) ^ 0x80808080u); }

FAK_DEVICE float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- unaligned loads --------------------------------------------------------------------

FAK_DEVICE u32 ld_u32_a2(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}
FAK_DEVICE u32 ld_u32(const u8* p) { return *(const u32*)p; }
FAK_DEVICE float ld_f16(const u8* p) { return f16_to_f32(*(const u16*)p); }

// ---- programmatic dependent launch (Hopper) ------------------------------------------------
//
// On sm_90 and later the host may launch a kernel with programmatic stream serialization
// (backend/cuda/launch.rs, FAK_CUDA_PDL): it then starts while the kernel before it in the stream
// is still running. Every kernel therefore calls `pdl_enter()` before its first access to memory
// that another kernel writes or reads: `griddepcontrol.wait` returns once the kernels before it
// have completed and their writes are visible (it returns at once for a launch without the
// attribute), and `griddepcontrol.launch_dependents` then lets the next kernel start, so at most
// one kernel waits ahead of a running one. What a kernel does before `pdl_enter()` may touch only
// memory no kernel writes: the weights (`prefetch_l2`). Compiled for an older architecture these
// are no-ops, and the host launches that image without the attribute.
FAK_DEVICE void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for the 128-byte lines of [p, p + bytes), spread over the block's threads (a hint: no
// register or shared memory is written). For weights, before `pdl_enter()`, so that a kernel
// started early has its weights on the way while the kernel before it finishes.
FAK_DEVICE void prefetch_l2(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const size_t a = (size_t)p & ~(size_t)127, end = (size_t)p + bytes;
    for (size_t l = a + 128 * (size_t)threadIdx.x; l < end; l += 128 * (size_t)blockDim.x)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(l));
#endif
}

// ---- reductions -------------------------------------------------------------------------

FAK_DEVICE float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
FAK_DEVICE int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
FAK_DEVICE float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum over the block (blockDim.x a multiple of 32, ≤ 1024). `sh` holds 32 floats. Every thread
// gets the result.
FAK_DEVICE float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

// ---- 8-bit activations, quantized exactly as fak's CPU backend ------------------------------
// The quantized matmuls read their input in the 8-bit form that the weight format's ggml
// `vec_dot_type` names, computed bit for bit as the CPU backend does (rust/src/backend/cpu/matmul/
// act.rs, i.e. llama.cpp's x86 CPU build), so that GPU and CPU make the same rounding decisions:
//
// - "q8_0 form" (for Q4_0, Q5_0, Q8_0, Q4_1, Q5_1 weights): per block of 32, amax = max|x|,
//   d = amax/127 (f32), q = round_half_even(x·(127/amax)) clamped to [−128, 127]; stored:
//   `qs0[i]` int8 and `ds0[b] = (f16(d), f16(d·Σq))` widened to f32 (the Q8_0 `d`; the Q8_1 `s`);
// - "q8_K form" (for Q4_K, Q5_K, Q6_K): per super-block of 256, `max` = the first element of
//   largest magnitude (with its sign), iscale = −127/max, q = min(127, round_half_even(iscale·x)),
//   d = 1/iscale (f32); stored: `qsk[i]` int8, `dk[sb] = d`, `sk[b]` = Σq of each 32 (i32).
//
// Both are written for flat arrays (rows of K laid end to end; K % 32 == 0 for the q8_0 form,
// K % 256 == 0 for the q8_K form, so blocks never straddle rows). A warp quantizes one chunk of
// 256 values: lane l holds v[j] = element 32·j + l of the chunk.

struct Q8Out {
    i8* qs0;
    float2* ds0;
    i8* qsk;
    float* dk;
    int* sk;
};

FAK_DEVICE float f16_round(float x) { return f16_to_f32(f32_to_f16(x)); }
FAK_DEVICE int warp_min_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Quantizes the chunk of 256 values starting at flat element `base` (a multiple of 32), held
// 8 consecutive values per lane (lane l: values base + 8l .. base + 8l + 7, so block b of 32 is
// lanes 4b..4b+3): its first `nb` (≤ 8) blocks of 32 in the q8_0 form and, when `with_k`
// (nb == 8, base % 256 == 0), the whole chunk as one q8_K super-block. Lanes of blocks ≥ nb
// must hold zeros. Every lane of the warp must call it. The results depend only on the values
// (maxima, integer sums, the lowest index of the maximum), so they are the CPU quantizers' bits;
// holding a block in 4 lanes makes its reductions 2 shuffles instead of 5 per block.
FAK_DEVICE void quantize_chunk(const float (&v)[8], int nb, bool with_k, size_t base, const Q8Out& o, int lane) {
    const int b = lane >> 2;
    const bool valid = b < nb;
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) a = fmaxf(a, fabsf(v[i]));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
    {
        const float d = a / 127.0f;
        const float id = a != 0.0f ? 127.0f / a : 0.0f;
        u32 w0 = 0, w1 = 0;
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = max(-128, min(127, __float2int_rn(v[i] * id)));
            s += q;
            if (i < 4) w0 |= ((u32)q & 0xFFu) << (8 * i);
            else w1 |= ((u32)q & 0xFFu) << (8 * (i - 4));
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (valid) {
            *(uint2*)(o.qs0 + base + 8 * lane) = make_uint2(w0, w1);
            if ((lane & 3) == 0) o.ds0[(base >> 5) + b] = make_float2(f16_round(d), f16_round(d * (float)s));
        }
    }
    if (!with_k) return;
    float amax = a;
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
    if (amax == 0.0f) {
        *(uint2*)(o.qsk + base + 8 * lane) = make_uint2(0u, 0u);
        if (lane < 8) o.sk[(base >> 5) + lane] = 0;
        if (lane == 0) o.dk[base >> 8] = 0.0f;
        return;
    }
    // The first element (lowest index) whose magnitude is the maximum, and its signed value.
    int idx = 256;
#pragma unroll
    for (int i = 7; i >= 0; --i)
        if (fabsf(v[i]) == amax) idx = 8 * lane + i;
    idx = warp_min_i(idx);
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if ((idx & 7) == i) mine = v[i];
    const float mx = __shfl_sync(0xffffffffu, mine, idx >> 3);
    const float iscale = -127.0f / mx;
    u32 w0 = 0, w1 = 0;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int q = min(127, __float2int_rn(iscale * v[i]));
        s += q;
        if (i < 4) w0 |= ((u32)q & 0xFFu) << (8 * i);
        else w1 |= ((u32)q & 0xFFu) << (8 * (i - 4));
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    *(uint2*)(o.qsk + base + 8 * lane) = make_uint2(w0, w1);
    if ((lane & 3) == 0) o.sk[(base >> 5) + b] = s;
    if (lane == 0) o.dk[base >> 8] = 1.0f / iscale;
}

// ---- the batch as the kernels see it ------------------------------------------------------
// Mirrors `SeqRows` of rust/src/backend/mod.rs (five u32).
struct SeqRows {
    u32 row0, n_rows, n_past, table0, n_blocks;
};

// ---- tensor cores and asynchronous copies (sm_80+) -------------------------------------

FAK_DEVICE u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// Four 8x8 b16 matrices from shared memory (lane l gives the address of row l % 8 of matrix l / 8).
FAK_DEVICE void ldmatrix_x4(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
FAK_DEVICE void ldmatrix_x4_trans(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
// c (16x8 f32) += a (16x16 f16, row-major) · b (16x8 f16, column-major).
FAK_DEVICE void mma_f16(float* c, const u32* a, const u32* b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
FAK_DEVICE void cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem));
}
FAK_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> FAK_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// Loads that bypass L1 (data written by other blocks of the same launch).
FAK_DEVICE float4 ld_cg_f4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
FAK_DEVICE float2 ld_cg_f2(const float* p) {
    float2 v;
    asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
    return v;
}

#define NEG_INF (-__int_as_float(0x7f800000))
