//! Element-wise ops (`rust/kernels/elementwise.cu`): residual add, SwiGLU (fused with the 8-bit
//! quantization of its result when the length allows), the gather of logit rows.

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBatch, CudaBuffer};
use crate::Result;

fn grid_for(n: usize, per_block: usize) -> u32 {
    n.div_ceil(per_block).clamp(1, 8192) as u32
}

impl CudaBackend {
    pub(crate) fn op_swiglu(&self, gate: &mut CudaBuffer, up: &CudaBuffer, n: usize) -> Result<()> {
        if n % 32 == 0 {
            gate.written();
            let [qs0, ds0, qsk, dk, sk] = gate.q8_ptrs();
            // One warp per chunk of 256 values, 8 warps per block.
            self.launch(
                "elementwise",
                "swiglu_f32_q8",
                (grid_for(n, 2048), 1, 1),
                256,
                0,
                Args::new().ptr(gate.ptr()).ptr(up.ptr()).ptr(qs0).ptr(ds0).ptr(qsk).ptr(dk).ptr(sk).i32(n as i32),
            )?;
            gate.set_q8(n, n % 256 == 0);
            Ok(())
        } else {
            gate.written();
            self.launch("elementwise", "swiglu_f32", (grid_for(n, 256), 1, 1), 256, 0, Args::new().ptr(gate.ptr()).ptr(up.ptr()).i32(n as i32))
        }
    }

    pub(crate) fn op_add(&self, x: &mut CudaBuffer, y: &CudaBuffer, n: usize) -> Result<()> {
        x.written();
        self.launch("elementwise", "add_f32", (grid_for(n, 1024), 1, 1), 256, 0, Args::new().ptr(x.ptr()).ptr(y.ptr()).i32(n as i32))
    }

    pub(crate) fn op_gather_rows(&self, x: &CudaBuffer, batch: &CudaBatch, dim: usize, out: &mut CudaBuffer) -> Result<()> {
        out.written();
        let n = batch.plan.logit_rows.len();
        self.launch("elementwise", "gather_rows_f32", (n as u32, 1, 1), 256, 0, Args::new().ptr(x.ptr()).ptr(batch.logit_rows()).ptr(out.ptr()).i32(dim as i32))
    }
}
