// Embedding gather: out[r, :] = dequantize(table row tokens[r]) for every batch row, straight
// from the GGUF blocks of token_embd (no f32 copy of the table exists).
#include "quants.cuh"

template <int FMT>
__device__ void embed_rows(const u8* __restrict__ table, size_t row_bytes, const u32* __restrict__ tokens, float* __restrict__ out, int dim) {
    const size_t r = blockIdx.x;
    const u8* row = table + (size_t)tokens[r] * row_bytes;
    float* o = out + r * dim;
    for (int k = 8 * threadIdx.x; k < dim; k += 8 * blockDim.x) {
        float v[8];
        Quant<FMT>::deq8(row, k, v);
        ((float4*)(o + k))[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4*)(o + k))[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

#define EMBED(NAME, FMT)                                                                                     \
    extern "C" __global__ void embed_##NAME##_f32(const u8* __restrict__ table, size_t row_bytes,           \
                                                  const u32* __restrict__ tokens, float* __restrict__ out, int dim) { \
        pdl_enter();                                                                                                  \
        embed_rows<FMT>(table, row_bytes, tokens, out, dim);                                                 \
    }

EMBED(f32, T_F32)
EMBED(f16, T_F16)
EMBED(bf16, T_BF16)
EMBED(q4_0, T_Q4_0)
EMBED(q4_1, T_Q4_1)
EMBED(q5_0, T_Q5_0)
EMBED(q5_1, T_Q5_1)
EMBED(q8_0, T_Q8_0)
EMBED(q4_K, T_Q4_K)
EMBED(q5_K, T_Q5_K)
EMBED(q6_K, T_Q6_K)
