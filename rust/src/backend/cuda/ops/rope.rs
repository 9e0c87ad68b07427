//! RoPE (`rust/kernels/rope.cu`): one block per row; the angle recurrence and its rounding follow
//! the CPU backend (θ_scale = base^(−2/n_rot) is computed here, on the host, exactly as there).
//! The forward's q RoPE, k RoPE and KV write run as one launch (`op_rope_kv_write`). Scaling
//! (linear, YaRN, llama3 frequency factors) follows the CPU's `yarn_cos_sin`; its magnitude
//! `mscale` is computed here by the CPU's own function.

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBatch, CudaBuffer, CudaKvCache, CudaWeight};
use crate::backend::cpu::rope::mscale;
use crate::backend::{AttnParams, RopeParams, RopeStyle};
use crate::{FakError, Result};

/// θ_scale = base^(−2/n_rot) in f32, as the CPU backend rounds it; the kernels multiply a pair's
/// angle by it once per pair.
fn theta_scale(rope: &RopeParams) -> f32 {
    rope.freq_base.powf(-2.0 / rope.n_rot as f32)
}

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_rope(&self, x: &mut CudaBuffer, batch: &CudaBatch, n_rows: usize, n_heads: usize, head_dim: usize, rope: &RopeParams, freq_factors: Option<&CudaWeight>) -> Result<()> {
        x.written();
        let half = rope.n_rot / 2;
        self.launch(
            "rope",
            "rope_f32",
            (n_rows as u32, 1, 1),
            128,
            (half * 2 * 4) as u32,
            Args::new()
                .ptr(x.ptr())
                .ptr(batch.positions())
                .ptr(freq_factors.map_or(0, |f| f.mem.ptr()))
                .i32(n_heads as i32)
                .i32(head_dim as i32)
                .i32(rope.n_rot as i32)
                .f32(theta_scale(rope))
                .f32(rope.freq_scale)
                .i32((rope.style == RopeStyle::Neox) as i32)
                .f32(rope.ext_factor)
                .f32(mscale(rope))
                .f32(rope.corr_dims[0])
                .f32(rope.corr_dims[1]),
        )
    }

    /// RoPE of q and k and the KV write in one launch (`rope_qk_kv_write_f32`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_rope_kv_write(
        &self,
        q: &mut CudaBuffer,
        k: &mut CudaBuffer,
        v: &CudaBuffer,
        cache: &mut CudaKvCache,
        layer: usize,
        batch: &CudaBatch,
        n_rows: usize,
        attn: &AttnParams,
        rope: &RopeParams,
        freq_factors: Option<&CudaWeight>,
        qk_norm: Option<(&CudaWeight, &CudaWeight, f32)>,
    ) -> Result<()> {
        let l = cache.layout;
        if let Some((wq, wk, _)) = qk_norm {
            for w in [wq, wk] {
                if w.wtype != crate::quant::GgmlType::F32 || w.k() != attn.head_dim || w.dims.len() > 1 {
                    return Err(FakError::model(format!("tensor {} must be a vector of {} values", w.name, attn.head_dim)));
                }
            }
        }
        let (qn, kn, eps) = qk_norm.map_or((0, 0, 0.0), |(wq, wk, e)| (wq.mem.ptr(), wk.mem.ptr(), e));
        if l.n_head_kv != attn.n_head_kv || l.head_dim != attn.head_dim || rope.n_rot > attn.head_dim || !rope.n_rot.is_multiple_of(2) {
            return Err(FakError::invalid("rope_kv_write", format!("cache {}×{}, attention {}×{}, n_rot {}", l.n_head_kv, l.head_dim, attn.n_head_kv, attn.head_dim, rope.n_rot)));
        }
        q.written();
        k.written();
        let half = rope.n_rot / 2;
        self.launch(
            "rope",
            "rope_qk_kv_write_f32",
            (n_rows as u32, 1, 1),
            256,
            (half.max(1) * 2 * 4) as u32,
            Args::new()
                .ptr(q.ptr())
                .ptr(k.ptr())
                .ptr(v.ptr())
                .ptr(batch.positions())
                .ptr(batch.slots())
                .ptr(freq_factors.map_or(0, |f| f.mem.ptr()))
                .ptr(cache.k_layer(layer))
                .ptr(cache.v_layer(layer))
                .i32(attn.n_head as i32)
                .i32(attn.n_head_kv as i32)
                .i32(attn.head_dim as i32)
                .i32(rope.n_rot as i32)
                .f32(theta_scale(rope))
                .f32(rope.freq_scale)
                .i32((rope.style == RopeStyle::Neox) as i32)
                .i32(l.block_size as i32)
                .f32(rope.ext_factor)
                .f32(mscale(rope))
                .f32(rope.corr_dims[0])
                .f32(rope.corr_dims[1])
                .ptr(qn)
                .ptr(kn)
                .f32(eps),
        )
    }
}
