// fak CUDA kernels: every GGUF block format's device code in one place, as llama.cpp keeps its
// per-type dot products in `vecdotq.cuh` for one generic `mul_mat_vec_q`.
//
// `Quant<T_X>` holds what the kernel families need to read format X, straight from its blocks:
//   QK, BYTES      values and bytes per block (1 and the value size for the dense formats);
//   KFORM          the quantized formats' activation form (common.cuh): true for the q8_K form
//                  (k-quants), false for the q8_0 form (legacy formats);
//   deq8           8 consecutive values (k % 8 == 0) as f32: the embedding gather, the dense GEMV,
//                  the f16 tensor-core GEMM's tiles (mmvq.cu, embed.cu, mmq.cu);
//   RAW16, fetch16 the raw 32-bit words (RAW16 of them) that hold 16 consecutive values
//                  (k % 16 == 0): the GEMMs fetch them a step ahead and decode them later (mmq.cu);
//   decode16       those words as 16 f32 (the f16 GEMM);
//   decode16_i8    those words as 16 int8 in four words plus the row's scalars of this k-step:
//                  si0/si1 integer scales (Q4_K/Q5_K: sc, m; Q6_K: the sub-block scale of these 16),
//                  sf0/sf1 float scales (d, dmin / d, m) (the CPU-faithful int8 GEMM, mmq.cu);
//   dot<NC>        one GEMV task of 32 weights against NC activation rows in the 8-bit form,
//                  integer-exact with dp4a, scaled as ggml_vec_dot_* scales it (mmvq.cu; the task
//                  shapes are described there).
// The fragment mode of the int8 GEMM (mmq.cu) builds its MMA fragments of Q4_K/Q6_K straight from
// staged blocks with the field helpers below (nib4, k4_scale_min_r), in the MMA's own layout.
//
// Layouts follow ggml (`ggml-common.h`, `ggml-quants.c` dequantize_row_*); offsets are in bytes from
// the start of a block. Blocks of 18/22/34/210 bytes are only 2-byte aligned, so their 32-bit words
// are read as two 16-bit loads (ld_u32_a2) or funnel-shifted from aligned words (ld16_a2).
#pragma once
#include "common.cuh"

// ---- field helpers -------------------------------------------------------------------------

// Nibbles at bit `sh` (0 or 4) of each byte of a word, as four bytes.
FAK_DEVICE int nib4(u32 w, int sh) { return (int)((w >> sh) & 0x0F0F0F0Fu); }
// Eight nibbles of a word as two words of bytes (low nibbles, high nibbles).
FAK_DEVICE int nib_lo(u32 w) { return (int)(w & 0x0F0F0F0Fu); }
FAK_DEVICE int nib_hi(u32 w) { return (int)((w >> 4) & 0x0F0F0F0Fu); }
// Bits 0..3 of b moved to bit 4 of bytes 0..3.
FAK_DEVICE int bits_to_b4(u32 b) { return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25)); }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block, from its scales[12]
// at `s` (ggml `get_scale_min_k4`).
FAK_DEVICE void q4k_scale_min(const u8* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
// Byte i (0..11) of three words (a runtime index without a local-memory array).
FAK_DEVICE int byte_of3(u32 a, u32 b, u32 c, int i) {
    const u32 w = i < 4 ? a : (i < 8 ? b : c);
    return (int)((w >> (8 * (i & 3))) & 0xFF);
}
// q4k_scale_min over the scales[12] held in three words (bytes 4..15 of the block header).
FAK_DEVICE void k4_scale_min_r(u32 a, u32 b, u32 c, int j, int& sc, int& m) {
    if (j < 4) {
        sc = byte_of3(a, b, c, j) & 63;
        m = byte_of3(a, b, c, j + 4) & 63;
    } else {
        sc = (byte_of3(a, b, c, j + 4) & 0xF) | ((byte_of3(a, b, c, j - 4) >> 6) << 4);
        m = (byte_of3(a, b, c, j + 4) >> 4) | ((byte_of3(a, b, c, j) >> 6) << 4);
    }
}
// 16 bytes at a 2-aligned address as four words: five aligned 32-bit loads and funnel shifts
// (instead of eight 16-bit loads); the fifth word stays inside the 210-byte Q6_K block for the
// offsets Quant<T_Q6_K>::fetch16 reads (≤ 176 + 20).
FAK_DEVICE void ld16_a2(const u8* p, u32* out) {
    const u32* q = (const u32*)((size_t)p & ~(size_t)3);
    const u32 sh = ((u32)(size_t)p & 3u) * 8u;
    u32 w[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) w[i] = q[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

template <int FMT> struct Quant;

// ==== F32 ====================================================================================
// f32 (4 B a value).
template <> struct Quant<T_F32> {
    static constexpr int QK = 1, BYTES = 4;  // values and bytes per block
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const float4* p = (const float4*)(row + 4 * (size_t)k);
        const float4 a = p[0], b = p[1];
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    }
    static constexpr int RAW16 = 16;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const uint4* p = (const uint4*)(row + 4 * (size_t)k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 v = p[i];
            r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
        }
    }
    static FAK_DEVICE void decode16(const u32* r, int, float* out) {
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = __uint_as_float(r[i]);
    }
};

// ==== F16 ====================================================================================
// f16 (2 B a value, IEEE half).
template <> struct Quant<T_F16> {
    static constexpr int QK = 1, BYTES = 2;  // values and bytes per block
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const uint4 v = *(const uint4*)(row + 2 * (size_t)k);
        out[0] = f16_lo(v.x); out[1] = f16_hi(v.x); out[2] = f16_lo(v.y); out[3] = f16_hi(v.y);
        out[4] = f16_lo(v.z); out[5] = f16_hi(v.z); out[6] = f16_lo(v.w); out[7] = f16_hi(v.w);
    }
    static constexpr int RAW16 = 8;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const uint4* p = (const uint4*)(row + 2 * (size_t)k);
        const uint4 a = p[0], b = p[1];
        r[0] = a.x; r[1] = a.y; r[2] = a.z; r[3] = a.w; r[4] = b.x; r[5] = b.y; r[6] = b.z; r[7] = b.w;
    }
    static FAK_DEVICE void decode16(const u32* r, int, float* out) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            out[2 * i] = f16_lo(r[i]);
            out[2 * i + 1] = f16_hi(r[i]);
        }
    }
};

// ==== BF16 ===================================================================================
// bf16 (2 B a value: the high half of an f32).
template <> struct Quant<T_BF16> {
    static constexpr int QK = 1, BYTES = 2;  // values and bytes per block
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const uint4 v = *(const uint4*)(row + 2 * (size_t)k);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[2 * i] = __uint_as_float(w[i] << 16);
            out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        }
    }
    static constexpr int RAW16 = 8;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) { Quant<T_F16>::fetch16(row, k, r); }
    static FAK_DEVICE void decode16(const u32* r, int, float* out) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            out[2 * i] = __uint_as_float(r[i] << 16);
            out[2 * i + 1] = __uint_as_float(r[i] & 0xFFFF0000u);
        }
    }
};

// ==== Q4_0 ===================================================================================
// Q4_0, blocks of 32 in 18 B (2-aligned): d f16 @0, qs[16] @2. Element o < 16 is the low nibble of
// qs[o], o >= 16 the high nibble of qs[o - 16] (16 values of a half-block: one nibble of all 16
// bytes); x = d·(q − 8).
template <> struct Quant<T_Q4_0> {
    static constexpr int QK = 32, BYTES = 18;  // values and bytes per block
    static constexpr bool KFORM = false;  // activations in the q8_0 form (Q8_1's s for Q4_1/Q5_1)
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 5) * 18;
        const int o = k & 31;
        const float d = ld_f16(b);
        const u8* q = b + 2 + (o & 15);
        const u32 w0 = ld_u32_a2(q), w1 = ld_u32_a2(q + 4);
        const int sh = o >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[i] = (float)((int)((w0 >> (8 * i + sh)) & 0xF) - 8) * d;
            out[4 + i] = (float)((int)((w1 >> (8 * i + sh)) & 0xF) - 8) * d;
        }
    }
    static constexpr int RAW16 = 5;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 18;
        r[0] = *(const u16*)b;
#pragma unroll
        for (int i = 0; i < 4; ++i) r[1 + i] = ld_u32_a2(b + 2 + 4 * i);
    }
    static FAK_DEVICE void decode16(const u32* r, int k, float* out) {
        const float d = f16_to_f32((u16)r[0]);
        const int sh = (k & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = (float)((int)((r[1 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) - 8) * d;
    }
    static FAK_DEVICE void decode16_i8(const u32* r, int k, int* q, int& si0, int& si1, float& sf0, float& sf1) {
        const int sh = (k & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = bytes_sub(nib4(r[1 + i], sh), 0x08080808);
        sf0 = f16_to_f32((u16)r[0]);
        sf1 = 0.0f;
        si0 = si1 = 0;
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        const float2* __restrict__ yds = (const float2*)ya;
        const u8* b = row + (size_t)t * 18;
        const float d = ld_f16(b);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 w = ld_u32_a2(b + 2 + 4 * i);
            lo[i] = bytes_sub(nib_lo(w), 0x08080808);
            hi[i] = bytes_sub(nib_hi(w), 0x08080808);
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int4* y = (const int4*)(yq + (size_t)c * K + 32 * t);
            const int4 y0 = y[0], y1 = y[1];
            int s = dp4a(lo[0], y0.x, dp4a(lo[1], y0.y, dp4a(lo[2], y0.z, dp4a(lo[3], y0.w, 0))));
            s = dp4a(hi[0], y1.x, dp4a(hi[1], y1.y, dp4a(hi[2], y1.z, dp4a(hi[3], y1.w, s))));
            acc[c] += d * yds[(size_t)c * (K / 32) + t].x * (float)s;
        }
    }
};

// ==== Q4_1 ===================================================================================
// Q4_1, blocks of 32 in 20 B (4-aligned): d f16 @0, m f16 @2, qs[16] @4 (nibbles as Q4_0);
// x = d·q + m.
template <> struct Quant<T_Q4_1> {
    static constexpr int QK = 32, BYTES = 20;  // values and bytes per block
    static constexpr bool KFORM = false;  // activations in the q8_0 form (Q8_1's s for Q4_1/Q5_1)
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 5) * 20;
        const int o = k & 31;
        const u32 dm = ld_u32(b);
        const float d = f16_lo(dm), m = f16_hi(dm);
        const u8* q = b + 4 + (o & 15);
        const u32 w0 = ld_u32_a2(q), w1 = ld_u32_a2(q + 4);
        const int sh = o >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[i] = (float)((w0 >> (8 * i + sh)) & 0xF) * d + m;
            out[4 + i] = (float)((w1 >> (8 * i + sh)) & 0xF) * d + m;
        }
    }
    static constexpr int RAW16 = 5;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 20;
        r[0] = ld_u32(b);
#pragma unroll
        for (int i = 0; i < 4; ++i) r[1 + i] = ld_u32(b + 4 + 4 * i);
    }
    static FAK_DEVICE void decode16(const u32* r, int k, float* out) {
        const float d = f16_lo(r[0]), m = f16_hi(r[0]);
        const int sh = (k & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = (float)((r[1 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) * d + m;
    }
    static FAK_DEVICE void decode16_i8(const u32* r, int k, int* q, int& si0, int& si1, float& sf0, float& sf1) {
        const int sh = (k & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = nib4(r[1 + i], sh);
        sf0 = f16_lo(r[0]);
        sf1 = f16_hi(r[0]);
        si0 = si1 = 0;
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        const float2* __restrict__ yds = (const float2*)ya;
        const u8* b = row + (size_t)t * 20;
        const u32 dm = ld_u32(b);
        const float d = f16_lo(dm), m = f16_hi(dm);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 w = ld_u32(b + 4 + 4 * i);
            lo[i] = nib_lo(w);
            hi[i] = nib_hi(w);
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int4* y = (const int4*)(yq + (size_t)c * K + 32 * t);
            const int4 y0 = y[0], y1 = y[1];
            int s = dp4a(lo[0], y0.x, dp4a(lo[1], y0.y, dp4a(lo[2], y0.z, dp4a(lo[3], y0.w, 0))));
            s = dp4a(hi[0], y1.x, dp4a(hi[1], y1.y, dp4a(hi[2], y1.z, dp4a(hi[3], y1.w, s))));
            const float2 ds = yds[(size_t)c * (K / 32) + t];
            acc[c] += d * ds.x * (float)s + m * ds.y;
        }
    }
};

// ==== Q5_0 ===================================================================================
// Q5_0, blocks of 32 in 22 B (2-aligned): d f16 @0, qh u32 @2 (bit o is the 5th bit of element o),
// qs[16] @6 (nibbles as Q4_0); x = d·(q − 16), q = nibble | bit << 4.
template <> struct Quant<T_Q5_0> {
    static constexpr int QK = 32, BYTES = 22;  // values and bytes per block
    static constexpr bool KFORM = false;  // activations in the q8_0 form (Q8_1's s for Q4_1/Q5_1)
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 5) * 22;
        const int o = k & 31;
        const float d = ld_f16(b);
        const u32 qh = ld_u32_a2(b + 2);
        const u8* q = b + 6 + (o & 15);
        const u32 w0 = ld_u32_a2(q), w1 = ld_u32_a2(q + 4);
        const int sh = o >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int q0 = (int)(((w0 >> (8 * i + sh)) & 0xF) | (((qh >> (o + i)) & 1) << 4));
            const int q1 = (int)(((w1 >> (8 * i + sh)) & 0xF) | (((qh >> (o + 4 + i)) & 1) << 4));
            out[i] = (float)(q0 - 16) * d;
            out[4 + i] = (float)(q1 - 16) * d;
        }
    }
    static constexpr int RAW16 = 6;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 22;
        r[0] = *(const u16*)b;
        r[1] = ld_u32_a2(b + 2);
#pragma unroll
        for (int i = 0; i < 4; ++i) r[2 + i] = ld_u32_a2(b + 6 + 4 * i);
    }
    static FAK_DEVICE void decode16(const u32* r, int k, float* out) {
        const float d = f16_to_f32((u16)r[0]);
        const int o = k & 16, sh = o ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int q = (int)(((r[2 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) | (((r[1] >> (o + i)) & 1) << 4));
            out[i] = (float)(q - 16) * d;
        }
    }
    static FAK_DEVICE void decode16_i8(const u32* r, int k, int* q, int& si0, int& si1, float& sf0, float& sf1) {
        const int o = k & 16, sh = o ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = bytes_sub(nib4(r[2 + i], sh) | bits_to_b4((r[1] >> (o + 4 * i)) & 0xF), 0x10101010);
        sf0 = f16_to_f32((u16)r[0]);
        sf1 = 0.0f;
        si0 = si1 = 0;
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        const float2* __restrict__ yds = (const float2*)ya;
        const u8* b = row + (size_t)t * 22;
        const float d = ld_f16(b);
        const u32 qh = ld_u32_a2(b + 2);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 w = ld_u32_a2(b + 6 + 4 * i);
            lo[i] = bytes_sub(nib_lo(w) | bits_to_b4((qh >> (4 * i)) & 0xF), 0x10101010);
            hi[i] = bytes_sub(nib_hi(w) | bits_to_b4((qh >> (16 + 4 * i)) & 0xF), 0x10101010);
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int4* y = (const int4*)(yq + (size_t)c * K + 32 * t);
            const int4 y0 = y[0], y1 = y[1];
            int s = dp4a(lo[0], y0.x, dp4a(lo[1], y0.y, dp4a(lo[2], y0.z, dp4a(lo[3], y0.w, 0))));
            s = dp4a(hi[0], y1.x, dp4a(hi[1], y1.y, dp4a(hi[2], y1.z, dp4a(hi[3], y1.w, s))));
            acc[c] += d * yds[(size_t)c * (K / 32) + t].x * (float)s;
        }
    }
};

// ==== Q5_1 ===================================================================================
// Q5_1, blocks of 32 in 24 B (8-aligned): d f16 @0, m f16 @2, qh u32 @4, qs[16] @8; x = d·q + m.
template <> struct Quant<T_Q5_1> {
    static constexpr int QK = 32, BYTES = 24;  // values and bytes per block
    static constexpr bool KFORM = false;  // activations in the q8_0 form (Q8_1's s for Q4_1/Q5_1)
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 5) * 24;
        const int o = k & 31;
        const u32 dm = ld_u32(b);
        const float d = f16_lo(dm), m = f16_hi(dm);
        const u32 qh = ld_u32(b + 4);
        const u8* q = b + 8 + (o & 15);
        const u32 w0 = ld_u32(q), w1 = ld_u32(q + 4);
        const int sh = o >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 q0 = ((w0 >> (8 * i + sh)) & 0xF) | (((qh >> (o + i)) & 1) << 4);
            const u32 q1 = ((w1 >> (8 * i + sh)) & 0xF) | (((qh >> (o + 4 + i)) & 1) << 4);
            out[i] = (float)q0 * d + m;
            out[4 + i] = (float)q1 * d + m;
        }
    }
    static constexpr int RAW16 = 6;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 24;
        r[0] = ld_u32(b);
        r[1] = ld_u32(b + 4);
#pragma unroll
        for (int i = 0; i < 4; ++i) r[2 + i] = ld_u32(b + 8 + 4 * i);
    }
    static FAK_DEVICE void decode16(const u32* r, int k, float* out) {
        const float d = f16_lo(r[0]), m = f16_hi(r[0]);
        const int o = k & 16, sh = o ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 q = ((r[2 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) | (((r[1] >> (o + i)) & 1) << 4);
            out[i] = (float)q * d + m;
        }
    }
    static FAK_DEVICE void decode16_i8(const u32* r, int k, int* q, int& si0, int& si1, float& sf0, float& sf1) {
        const int o = k & 16, sh = o ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = nib4(r[2 + i], sh) | bits_to_b4((r[1] >> (o + 4 * i)) & 0xF);
        sf0 = f16_lo(r[0]);
        sf1 = f16_hi(r[0]);
        si0 = si1 = 0;
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        const float2* __restrict__ yds = (const float2*)ya;
        const u8* b = row + (size_t)t * 24;
        const u32 dm = ld_u32(b);
        const float d = f16_lo(dm), m = f16_hi(dm);
        const u32 qh = ld_u32(b + 4);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 w = ld_u32(b + 8 + 4 * i);
            lo[i] = nib_lo(w) | bits_to_b4((qh >> (4 * i)) & 0xF);
            hi[i] = nib_hi(w) | bits_to_b4((qh >> (16 + 4 * i)) & 0xF);
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int4* y = (const int4*)(yq + (size_t)c * K + 32 * t);
            const int4 y0 = y[0], y1 = y[1];
            int s = dp4a(lo[0], y0.x, dp4a(lo[1], y0.y, dp4a(lo[2], y0.z, dp4a(lo[3], y0.w, 0))));
            s = dp4a(hi[0], y1.x, dp4a(hi[1], y1.y, dp4a(hi[2], y1.z, dp4a(hi[3], y1.w, s))));
            const float2 ds = yds[(size_t)c * (K / 32) + t];
            acc[c] += d * ds.x * (float)s + m * ds.y;
        }
    }
};

// ==== Q8_0 ===================================================================================
// Q8_0, blocks of 32 in 34 B (2-aligned): d f16 @0, qs[32] int8 @2; x = d·q.
template <> struct Quant<T_Q8_0> {
    static constexpr int QK = 32, BYTES = 34;  // values and bytes per block
    static constexpr bool KFORM = false;  // activations in the q8_0 form (Q8_1's s for Q4_1/Q5_1)
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 5) * 34;
        const int o = k & 31;
        const float d = ld_f16(b);
        const u32 w0 = ld_u32_a2(b + 2 + o), w1 = ld_u32_a2(b + 6 + o);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[i] = (float)(i8)(w0 >> (8 * i)) * d;
            out[4 + i] = (float)(i8)(w1 >> (8 * i)) * d;
        }
    }
    static constexpr int RAW16 = 5;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 5) * 34;
        r[0] = *(const u16*)b;
#pragma unroll
        for (int i = 0; i < 4; ++i) r[1 + i] = ld_u32_a2(b + 2 + (k & 31) + 4 * i);
    }
    static FAK_DEVICE void decode16(const u32* r, int, float* out) {
        const float d = f16_to_f32((u16)r[0]);
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = (float)(i8)(r[1 + i / 4] >> (8 * (i & 3))) * d;
    }
    static FAK_DEVICE void decode16_i8(const u32* r, int, int* q, int& si0, int& si1, float& sf0, float& sf1) {
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = (int)r[1 + i];
        sf0 = f16_to_f32((u16)r[0]);
        sf1 = 0.0f;
        si0 = si1 = 0;
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        const float2* __restrict__ yds = (const float2*)ya;
        const u8* b = row + (size_t)t * 34;
        const float d = ld_f16(b);
        int w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (int)ld_u32_a2(b + 2 + 4 * i);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int4* y = (const int4*)(yq + (size_t)c * K + 32 * t);
            const int4 y0 = y[0], y1 = y[1];
            int s = dp4a(w[0], y0.x, dp4a(w[1], y0.y, dp4a(w[2], y0.z, dp4a(w[3], y0.w, 0))));
            s = dp4a(w[4], y1.x, dp4a(w[5], y1.y, dp4a(w[6], y1.z, dp4a(w[7], y1.w, s))));
            acc[c] += d * yds[(size_t)c * (K / 32) + t].x * (float)s;
        }
    }
};

// ---- Q4_K and Q5_K: the GEMV task they share ---------------------------------------------

// Q4_K and Q5_K share the task shape (see the file comment). Per super-block the CPU computes
// (d_x·d)·Σ_j sc_j·dot_j − (d_x·dmin)·Σ_j m_j·bsum_j; a task contributes its part of both sums.
template <int FMT, int NC> FAK_DEVICE void dot_q45_K(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const float* __restrict__ yd, const int* __restrict__ ys, int K, float* acc) {
    constexpr int BB = FMT == T_Q4_K ? 144 : 176;
    constexpr int QS = FMT == T_Q4_K ? 16 : 48;
    const int sb = t >> 3, c8 = t & 7, p = c8 >> 1, h = c8 & 1;
    const u8* b = row + (size_t)sb * BB;
    const u32 dm = ld_u32(b);
    int sc0, m0, sc1, m1;
    q4k_scale_min(b + 4, 2 * p, sc0, m0);
    q4k_scale_min(b + 4, 2 * p + 1, sc1, m1);
    const uint4 qv = *(const uint4*)(b + QS + 32 * p + 16 * h);
    const u32 qw[4] = {qv.x, qv.y, qv.z, qv.w};
    int lo[4], hi[4];
    if (FMT == T_Q4_K) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo[i] = nib_lo(qw[i]);
            hi[i] = nib_hi(qw[i]);
        }
    } else {
        const uint4 hv = *(const uint4*)(b + 16 + 16 * h);
        const u32 hw[4] = {hv.x, hv.y, hv.z, hv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo[i] = nib_lo(qw[i]) | (int)(((hw[i] >> (2 * p)) & 0x01010101u) << 4);
            hi[i] = nib_hi(qw[i]) | (int)(((hw[i] >> (2 * p + 1)) & 0x01010101u) << 4);
        }
    }
    const float d = f16_lo(dm), dmin = f16_hi(dm);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const i8* y = yq + (size_t)c * K + sb * 256 + 64 * p + 16 * h;
        const int4 ylo = *(const int4*)y, yhi = *(const int4*)(y + 32);
        const int s0 = dp4a(lo[0], ylo.x, dp4a(lo[1], ylo.y, dp4a(lo[2], ylo.z, dp4a(lo[3], ylo.w, 0))));
        const int s1 = dp4a(hi[0], yhi.x, dp4a(hi[1], yhi.y, dp4a(hi[2], yhi.z, dp4a(hi[3], yhi.w, 0))));
        const float dx = yd[(size_t)c * (K / 256) + sb];
        float v = (dx * d) * (float)(sc0 * s0 + sc1 * s1);
        if (h == 0) {
            const int* bs = ys + (size_t)c * (K / 32) + sb * 8 + 2 * p;
            v -= (dx * dmin) * (float)(m0 * bs[0] + m1 * bs[1]);
        }
        acc[c] += v;
    }
}

// ==== Q4_K ===================================================================================
// Q4_K, super-blocks of 256 in 144 B: d f16 @0, dmin f16 @2, scales[12] @4 (6-bit sc_j, m_j of the
// 8 sub-blocks: q4k_scale_min), qs[128] @16. Sub-block j (32 values) = nibble (j & 1) of
// qs[32·(j/2) .. +32]; x = d·sc_j·q − dmin·m_j. The GEMV's tasks: see dot_q45_K.
template <> struct Quant<T_Q4_K> {
    static constexpr int QK = 256, BYTES = 144;  // values and bytes per block
    static constexpr bool KFORM = true;  // activations in the q8_K form
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 8) * 144;
        const int w = k & 255, p = w >> 6, hi = (w >> 5) & 1, l0 = w & 31;
        const u32 dm = ld_u32(b);
        int sc, m;
        q4k_scale_min(b + 4, 2 * p + hi, sc, m);
        const float d = f16_lo(dm) * (float)sc, mn = f16_hi(dm) * (float)m;
        const uint2 q = *(const uint2*)(b + 16 + 32 * p + l0);
        const int sh = 4 * hi;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[i] = d * (float)((q.x >> (8 * i + sh)) & 0xF) - mn;
            out[4 + i] = d * (float)((q.y >> (8 * i + sh)) & 0xF) - mn;
        }
    }
    static constexpr int RAW16 = 8;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 8) * 144;
        const int w = k & 255, p = w >> 6, l0 = w & 31;
        const uint4 h = *(const uint4*)b;
        r[0] = h.x; r[1] = h.y; r[2] = h.z; r[3] = h.w;
        const uint4 q = *(const uint4*)(b + 16 + 32 * p + l0);
        r[4] = q.x; r[5] = q.y; r[6] = q.z; r[7] = q.w;
    }
    static FAK_DEVICE void decode16(const u32* r, int k, float* out) {
        const int w = k & 255, hi = (w >> 5) & 1, j = 2 * (w >> 6) + hi;
        int sc, m;
        k4_scale_min_r(r[1], r[2], r[3], j, sc, m);
        const float d = f16_lo(r[0]) * (float)sc, mn = f16_hi(r[0]) * (float)m;
        const int sh = 4 * hi;
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = d * (float)((r[4 + i / 4] >> (8 * (i & 3) + sh)) & 0xF) - mn;
    }
    static FAK_DEVICE void decode16_i8(const u32* r, int k, int* q, int& si0, int& si1, float& sf0, float& sf1) {
        const int w = k & 255, hi = (w >> 5) & 1, j = 2 * (w >> 6) + hi;
        k4_scale_min_r(r[1], r[2], r[3], j, si0, si1);
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = nib4(r[4 + i], 4 * hi);
        sf0 = f16_lo(r[0]);
        sf1 = f16_hi(r[0]);
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        dot_q45_K<T_Q4_K, NC>(row, t, yq, (const float*)ya, ys, K, acc);
    }
};

// ==== Q5_K ===================================================================================
// Q5_K, super-blocks of 256 in 176 B: d @0, dmin @2, scales[12] @4 (as Q4_K), qh[32] @16, qs[128]
// @48 (as Q4_K); bit j of qh[l] is the 5th bit of element l of sub-block j.
template <> struct Quant<T_Q5_K> {
    static constexpr int QK = 256, BYTES = 176;  // values and bytes per block
    static constexpr bool KFORM = true;  // activations in the q8_K form
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 8) * 176;
        const int w = k & 255, p = w >> 6, hi = (w >> 5) & 1, l0 = w & 31, j = 2 * p + hi;
        const u32 dm = ld_u32(b);
        int sc, m;
        q4k_scale_min(b + 4, j, sc, m);
        const float d = f16_lo(dm) * (float)sc, mn = f16_hi(dm) * (float)m;
        const uint2 q = *(const uint2*)(b + 48 + 32 * p + l0);
        const uint2 h = *(const uint2*)(b + 16 + l0);
        const int sh = 4 * hi;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 q0 = ((q.x >> (8 * i + sh)) & 0xF) | (((h.x >> (8 * i + j)) & 1) << 4);
            const u32 q1 = ((q.y >> (8 * i + sh)) & 0xF) | (((h.y >> (8 * i + j)) & 1) << 4);
            out[i] = d * (float)q0 - mn;
            out[4 + i] = d * (float)q1 - mn;
        }
    }
    static constexpr int RAW16 = 12;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 8) * 176;
        const int w = k & 255, p = w >> 6, l0 = w & 31;
        const uint4 h = *(const uint4*)b;
        r[0] = h.x; r[1] = h.y; r[2] = h.z; r[3] = h.w;
        const uint4 q = *(const uint4*)(b + 48 + 32 * p + l0);
        r[4] = q.x; r[5] = q.y; r[6] = q.z; r[7] = q.w;
        const uint4 x = *(const uint4*)(b + 16 + l0);
        r[8] = x.x; r[9] = x.y; r[10] = x.z; r[11] = x.w;
    }
    static FAK_DEVICE void decode16(const u32* r, int k, float* out) {
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
    static FAK_DEVICE void decode16_i8(const u32* r, int k, int* q, int& si0, int& si1, float& sf0, float& sf1) {
        const int w = k & 255, hi = (w >> 5) & 1, j = 2 * (w >> 6) + hi;
        k4_scale_min_r(r[1], r[2], r[3], j, si0, si1);
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = nib4(r[4 + i], 4 * hi) | (int)(((r[8 + i] >> j) & 0x01010101u) << 4);
        sf0 = f16_lo(r[0]);
        sf1 = f16_hi(r[0]);
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        dot_q45_K<T_Q5_K, NC>(row, t, yq, (const float*)ya, ys, K, acc);
    }
};

// ==== Q6_K ===================================================================================
// Q6_K, super-blocks of 256 in 210 B (2-aligned): ql[128] @0, qh[64] @128, scales int8[16] @192,
// d f16 @208. Within each half n of 128: group g (32 values) takes nibble (g >> 1) of
// ql[64n + 32(g & 1) + l] and bits 2g..2g+1 of qh[32n + l]; scale index 8n + l/16 + 2g;
// x = d·sc·(q − 32). The GEMV: per super-block the CPU computes (d_x·d)·Σ_i sc_i·dot_i over its
// 16 sub-blocks of 16; a task (8 positions l of half n times the four groups sharing them) adds
// its part.
template <> struct Quant<T_Q6_K> {
    static constexpr int QK = 256, BYTES = 210;  // values and bytes per block
    static constexpr bool KFORM = true;  // activations in the q8_K form
    static FAK_DEVICE void deq8(const u8* __restrict__ row, int k, float* out) {
        const u8* b = row + (size_t)(k >> 8) * 210;
        const int w = k & 255, n = w >> 7, g = (w >> 5) & 3, l0 = w & 31;
        const float d = ld_f16(b + 208) * (float)(i8)b[192 + 8 * n + (l0 >> 4) + 2 * g];
        const u8* ql = b + 64 * n + 32 * (g & 1) + l0;
        const u8* qh = b + 128 + 32 * n + l0;
        const u32 a0 = ld_u32_a2(ql), a1 = ld_u32_a2(ql + 4);
        const u32 h0 = ld_u32_a2(qh), h1 = ld_u32_a2(qh + 4);
        const int sl = 4 * (g >> 1), shh = 2 * g;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int q0 = (int)(((a0 >> (8 * i + sl)) & 0xF) | (((h0 >> (8 * i + shh)) & 3) << 4)) - 32;
            const int q1 = (int)(((a1 >> (8 * i + sl)) & 0xF) | (((h1 >> (8 * i + shh)) & 3) << 4)) - 32;
            out[i] = d * (float)q0;
            out[4 + i] = d * (float)q1;
        }
    }
    static constexpr int RAW16 = 10;
    static FAK_DEVICE void fetch16(const u8* __restrict__ row, int k, u32* r) {
        const u8* b = row + (size_t)(k >> 8) * 210;
        const int w = k & 255, n = w >> 7, g = (w >> 5) & 3, l0 = w & 31;
        const u8* ql = b + 64 * n + 32 * (g & 1) + l0;
        const u8* qh = b + 128 + 32 * n + l0;
        ld16_a2(ql, r);
        ld16_a2(qh, r + 4);
        r[8] = (u32)(int)(i8)b[192 + 8 * n + (l0 >> 4) + 2 * g];
        r[9] = *(const u16*)(b + 208);
    }
    static FAK_DEVICE void decode16(const u32* r, int k, float* out) {
        const int g = (k >> 5) & 3, sl = 4 * (g >> 1), shh = 2 * g;
        const float d = f16_to_f32((u16)r[9]) * (float)(int)r[8];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int q = (int)(((r[i / 4] >> (8 * (i & 3) + sl)) & 0xF) | (((r[4 + i / 4] >> (8 * (i & 3) + shh)) & 3) << 4)) - 32;
            out[i] = d * (float)q;
        }
    }
    static FAK_DEVICE void decode16_i8(const u32* r, int k, int* q, int& si0, int& si1, float& sf0, float& sf1) {
        const int g = (k >> 5) & 3;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            q[i] = bytes_sub(nib4(r[i], 4 * (g >> 1)) | (int)(((r[4 + i] >> (2 * g)) & 0x03030303u) << 4), 0x20202020);
        si0 = (int)r[8];
        si1 = 0;
        sf0 = f16_to_f32((u16)r[9]);
        sf1 = 0.0f;
    }
    template <int NC> static FAK_DEVICE void dot(const u8* __restrict__ row, int t, const i8* __restrict__ yq, const void* __restrict__ ya, const int* __restrict__ ys, int K, float* acc) {
        const float* __restrict__ yd = (const float*)ya;
        const int sb = t >> 3, c8 = t & 7, n = c8 >> 2, lq = (c8 & 3) * 8;
        const u8* b = row + (size_t)sb * 210;
        const u8* qla = b + 64 * n + lq;
        const u8* qhp = b + 128 + 32 * n + lq;
        int v[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 a = ld_u32_a2(qla + 4 * i), bq = ld_u32_a2(qla + 32 + 4 * i), hq = ld_u32_a2(qhp + 4 * i);
            v[0][i] = bytes_sub(nib_lo(a) | (int)((hq & 0x03030303u) << 4), 0x20202020);
            v[1][i] = bytes_sub(nib_lo(bq) | (int)(((hq >> 2) & 0x03030303u) << 4), 0x20202020);
            v[2][i] = bytes_sub(nib_hi(a) | (int)(((hq >> 4) & 0x03030303u) << 4), 0x20202020);
            v[3][i] = bytes_sub(nib_hi(bq) | (int)(((hq >> 6) & 0x03030303u) << 4), 0x20202020);
        }
        // Scales of groups g = 0..3: bytes 192 + 8n + lq/16 + 2g (the offset can be odd: bytes).
        const u8* scp = b + 192 + 8 * n + (lq >> 4);
        const int sc[4] = {(int)(i8)scp[0], (int)(i8)scp[2], (int)(i8)scp[4], (int)(i8)scp[6]};
        const float d = ld_f16(b + 208);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const i8* y = yq + (size_t)c * K + sb * 256 + 128 * n + lq;
            int is = 0;
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                const int2 yy = *(const int2*)(y + 32 * g);
                is += sc[g] * dp4a(v[g][0], yy.x, dp4a(v[g][1], yy.y, 0));
            }
            acc[c] += (yd[(size_t)c * (K / 256) + sb] * d) * (float)is;
        }
    }
};
