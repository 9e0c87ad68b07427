// Element-wise ops of the forward pass: residual add, SwiGLU (Shazeer 2020; silu(x) = x/(1+e^−x),
// as ggml's swiglu), the SwiGLU + 8-bit quantization fusion that feeds the down-projection GEMV,
// and the gather of the rows that need logits.
#include "common.cuh"

// x[i] += y[i], i < n. Vectorized by 4 when n % 4 == 0 (buffers are 256-byte aligned).
extern "C" __global__ void add_f32(float* __restrict__ x, const float* __restrict__ y, int n) {
    pdl_enter();
    const int stride = gridDim.x * blockDim.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ((n & 3) == 0) {
        for (; i < n / 4; i += stride) {
            float4 a = ((float4*)x)[i];
            const float4 b = ((const float4*)y)[i];
            a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
            ((float4*)x)[i] = a;
        }
    } else {
        for (; i < n; i += stride) x[i] += y[i];
    }
}

FAK_DEVICE float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// gate[i] = silu(gate[i])·up[i], i < n.
extern "C" __global__ void swiglu_f32(float* __restrict__ gate, const float* __restrict__ up, int n) {
    pdl_enter();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) gate[i] = silu_mul(gate[i], up[i]);
}

// The same, also writing the result's 8-bit forms (n % 32 == 0, buffers 16-byte aligned; see
// common.cuh). One warp per chunk of 256 values, 8 consecutive values per lane.
extern "C" __global__ void swiglu_f32_q8(float* __restrict__ gate, const float* __restrict__ up, i8* qs0, float2* ds0, i8* qsk,
                                         float* dk, int* sk, int n) {
    pdl_enter();
    const Q8Out q{qs0, ds0, qsk, dk, sk};
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int c = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; 256 * c < n; c += warps) {
        const int c0 = 256 * c, nb = min(8, (n - c0) / 32);
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if ((lane >> 2) < nb) {
            float4* gp = (float4*)(gate + c0 + 8 * lane);
            const float4* up4 = (const float4*)(up + c0 + 8 * lane);
            const float4 g0 = gp[0], g1 = gp[1], u0 = up4[0], u1 = up4[1];
            v[0] = silu_mul(g0.x, u0.x); v[1] = silu_mul(g0.y, u0.y); v[2] = silu_mul(g0.z, u0.z); v[3] = silu_mul(g0.w, u0.w);
            v[4] = silu_mul(g1.x, u1.x); v[5] = silu_mul(g1.y, u1.y); v[6] = silu_mul(g1.z, u1.z); v[7] = silu_mul(g1.w, u1.w);
            gp[0] = make_float4(v[0], v[1], v[2], v[3]);
            gp[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
        quantize_chunk(v, nb, nb == 8, c0, q, lane);
    }
}

// out[j, :] = x[rows[j], :] for j < n (rows of dim). One block per output row.
extern "C" __global__ void gather_rows_f32(const float* __restrict__ x, const u32* __restrict__ rows, float* __restrict__ out, int dim) {
    pdl_enter();
    const size_t j = blockIdx.x;
    const float* src = x + (size_t)rows[j] * dim;
    float* dst = out + j * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

// x[i] = v for i < n (test poisoning and zero-fills).
extern "C" __global__ void fill_f32(float* __restrict__ x, float v, size_t n) {
    pdl_enter();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = v;
}

// ---- the hybrids' gates (llama.cpp qwen35 / qwen35moe) ------------------------------------------

FAK_DEVICE float sigmoid_f32(float g) { return 1.0f / (1.0f + expf(-g)); }

// Gated attention's split of the query projection: qg `[rows·n_head, 2·head_dim]` (each head's
// query then its gate) → q, gate `[rows·n_head, head_dim]`; n = rows·n_head·head_dim.
extern "C" __global__ void split_q_gate_f32(const float* __restrict__ qg, float* __restrict__ q, float* __restrict__ gate, int head_dim, int n) {
    pdl_enter();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int rh = i / head_dim, d = i - rh * head_dim;
        const size_t src = (size_t)rh * 2 * head_dim + d;
        q[i] = qg[src];
        gate[i] = qg[src + head_dim];
    }
}

// x[i] *= sigmoid(gate[i]), i < n (ggml sigmoid then mul).
extern "C" __global__ void mul_sigmoid_f32(float* __restrict__ x, const float* __restrict__ gate, int n) {
    pdl_enter();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= sigmoid_f32(gate[i]);
}

// x[r, :] *= sigmoid(g[r]) for rows of dim, n = rows·dim (the shared expert's gate).
extern "C" __global__ void mul_rows_sigmoid_f32(float* __restrict__ x, const float* __restrict__ g, int dim, int n) {
    pdl_enter();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= sigmoid_f32(g[i / dim]);
}
