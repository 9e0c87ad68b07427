//! RMSNorm (`rust/kernels/norm.cu`): one block per row; when the row length is a multiple of 32
//! the kernel also writes the q8_1 copy that the next GEMVs read (rows of ≤ 8192: 1024 threads,
//! one register-resident pass).

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBuffer, CudaWeight};
use crate::{FakError, Result};

impl CudaBackend {
    pub(crate) fn op_rmsnorm(&self, x: &CudaBuffer, w: &CudaWeight, eps: f32, n_rows: usize, dim: usize, out: &mut CudaBuffer) -> Result<()> {
        if w.wtype != crate::quant::GgmlType::F32 || w.k() != dim || !w.is_vector() {
            return Err(FakError::model(format!("tensor {} must be a vector of {dim} values", w.name)));
        }
        let grid = (n_rows as u32, 1, 1);
        let nb = dim / 32;
        if dim % 32 == 0 && nb <= 256 && !super::super::safe_kernels() {
            let name = match nb.div_ceil(32) {
                1 => "rmsnorm_f32_q8_1_r1",
                2 => "rmsnorm_f32_q8_1_r2",
                3 | 4 => "rmsnorm_f32_q8_1_r4",
                _ => "rmsnorm_f32_q8_1_r8",
            };
            self.launch(
                "norm",
                name,
                grid,
                1024,
                0,
                Args::new().ptr(x.ptr()).ptr(w.mem.ptr()).ptr(out.ptr()).ptr(out.q8_qs()).ptr(out.q8_ds()).i32(dim as i32).f32(eps),
            )?;
            out.q8_len.set(n_rows * dim);
        } else if dim % 32 == 0 {
            self.launch(
                "norm",
                "rmsnorm_f32_q8_1",
                grid,
                256,
                0,
                Args::new().ptr(x.ptr()).ptr(w.mem.ptr()).ptr(out.ptr()).ptr(out.q8_qs()).ptr(out.q8_ds()).i32(dim as i32).f32(eps),
            )?;
            out.q8_len.set(n_rows * dim);
        } else {
            out.written();
            self.launch("norm", "rmsnorm_f32", grid, 256, 0, Args::new().ptr(x.ptr()).ptr(w.mem.ptr()).ptr(out.ptr()).i32(dim as i32).f32(eps))?;
        }
        Ok(())
    }
}
