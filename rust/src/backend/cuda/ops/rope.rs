//! RoPE (`rust/kernels/rope.cu`): one block per row; the angle recurrence and its rounding follow
//! the CPU backend (θ_scale = base^(−2/n_rot) is computed here, on the host, exactly as there).

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBatch, CudaBuffer, CudaWeight};
use crate::backend::{RopeParams, RopeStyle};
use crate::Result;

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_rope(&self, x: &mut CudaBuffer, batch: &CudaBatch, n_rows: usize, n_heads: usize, head_dim: usize, rope: &RopeParams, freq_factors: Option<&CudaWeight>) -> Result<()> {
        x.written();
        let theta_scale = rope.freq_base.powf(-2.0 / rope.n_rot as f32);
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
                .f32(theta_scale)
                .f32(rope.freq_scale)
                .i32((rope.style == RopeStyle::Neox) as i32),
        )
    }
}
