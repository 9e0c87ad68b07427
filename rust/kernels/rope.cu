// Rotary position embedding (Su et al. 2021) computed as ggml's CPU rope_f32 (and fak's CPU
// backend): pair i's angle starts at θ = p and is multiplied by θ_scale = base^(−2/n_rot) once per
// pair in f32 (θ_scale comes from the host, rounded as the CPU rounds it), divided by the pair's
// frequency factor when given, times freq_scale; cos/sin in f32. NORM rotates (2i, 2i+1), NEOX
// (i, i + n_rot/2); dimensions n_rot..head_dim pass through.
#include "common.cuh"

// x: [n_rows, n_heads, head_dim] in place; positions: [n_rows]. One block per row.
extern "C" __global__ void rope_f32(float* __restrict__ x, const u32* __restrict__ positions, const float* __restrict__ freq_factors,
                                    int n_heads, int head_dim, int n_rot, float theta_scale, float freq_scale, int neox) {
    extern __shared__ float cs[];  // [n_rot/2][2]
    const int half = n_rot / 2;
    const size_t r = blockIdx.x;
    const float pos = (float)positions[r];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = pos;
        for (int j = 0; j < i; ++j) theta *= theta_scale;
        const float ff = freq_factors ? freq_factors[i] : 1.0f;
        const float t = freq_scale * (theta / ff);
        float s, c;
        sincosf(t, &s, &c);
        cs[2 * i] = c;
        cs[2 * i + 1] = s;
    }
    __syncthreads();
    float* xr = x + r * (size_t)n_heads * head_dim;
    for (int w = threadIdx.x; w < n_heads * half; w += blockDim.x) {
        const int h = w / half, i = w - h * half;
        float* hx = xr + (size_t)h * head_dim;
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float x0 = hx[a], x1 = hx[b];
        hx[a] = x0 * c - x1 * s;
        hx[b] = x0 * s + x1 * c;
    }
}
