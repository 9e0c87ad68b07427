//! RMSNorm (`rust/kernels/norm.cu`): one block per row, every value in registers, the sum of
//! squares in f64 as the CPU backend; when the row length is a multiple of 32 the kernel also
//! writes the 8-bit forms the next matmul reads (the q8_K form too for multiples of 256).

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBuffer, CudaWeight};
use crate::{FakError, Result};

/// Longest row of the register-resident kernel (32 warps × 4 chunks of 256).
const MAX_REG_DIM: usize = 32 * 4 * 256;

impl CudaBackend {
    pub(crate) fn op_rmsnorm(&self, x: &CudaBuffer, w: &CudaWeight, eps: f32, n_rows: usize, dim: usize, out: &mut CudaBuffer) -> Result<()> {
        if w.wtype != crate::quant::GgmlType::F32 || w.k() != dim || !w.is_vector() {
            return Err(FakError::model(format!("tensor {} must be a vector of {dim} values", w.name)));
        }
        out.written();
        let grid = (n_rows as u32, 1, 1);
        if dim <= MAX_REG_DIM {
            let chunks = dim.div_ceil(256);
            let warps = chunks.min(32);
            let name = match chunks.div_ceil(warps) {
                1 => "rmsnorm_f32_q8_c1",
                2 => "rmsnorm_f32_q8_c2",
                _ => "rmsnorm_f32_q8_c4",
            };
            let q8 = dim % 32 == 0;
            let [qs0, ds0, qsk, dk, sk] = out.q8_ptrs();
            self.launch(
                "norm",
                name,
                grid,
                (32 * warps) as u32,
                0,
                Args::new().ptr(x.ptr()).ptr(w.mem.ptr()).ptr(out.ptr()).ptr(qs0).ptr(ds0).ptr(qsk).ptr(dk).ptr(sk).i32(q8 as i32).i32(dim as i32).f32(eps),
            )?;
            if q8 {
                out.set_q8(n_rows * dim, dim % 256 == 0);
            }
            Ok(())
        } else {
            self.launch("norm", "rmsnorm_f32", grid, 1024, 0, Args::new().ptr(x.ptr()).ptr(w.mem.ptr()).ptr(out.ptr()).i32(dim as i32).f32(eps))
        }
    }
}
