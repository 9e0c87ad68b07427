// KV cache write: each batch row's K and V (f32, [n_rows, n_head_kv·head_dim]) rounded to f16 into
// its slot of the paged cache. Layout per layer, as the CPU backend's: [block][kv_head][slot][head_dim],
// slot s = block·block_size + offset (the batch's `slots`).
#include "common.cuh"

// One block per row; head_dim even.
extern "C" __global__ void kv_write_f16(const float* __restrict__ k, const float* __restrict__ v, const u32* __restrict__ slots,
                                        u16* __restrict__ kc, u16* __restrict__ vc, int n_head_kv, int head_dim, int block_size) {
    pdl_enter();
    const size_t r = blockIdx.x;
    const u32 slot = slots[r];
    const u32 blk = slot / block_size, off = slot - blk * block_size;
    const int width = n_head_kv * head_dim;
    const float2* kr = (const float2*)(k + r * width);
    const float2* vr = (const float2*)(v + r * width);
    for (int p = threadIdx.x; p < width / 2; p += blockDim.x) {
        const int e = 2 * p, h = e / head_dim, d = e - h * head_dim;
        const size_t dst = (((size_t)blk * n_head_kv + h) * block_size + off) * head_dim + d;
        const float2 a = kr[p], b = vr[p];
        *(u32*)(kc + dst) = pack_f16x2(a.x, a.y);
        *(u32*)(vc + dst) = pack_f16x2(b.x, b.y);
    }
}
