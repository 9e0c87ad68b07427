//! Argmax on the device (`rust/kernels/sampling.cu`): only the winning ids come back to the host.

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBuffer};
use crate::Result;

impl CudaBackend {
    pub(crate) fn op_argmax(&self, x: &CudaBuffer, n_rows: usize, n_cols: usize, out: &mut [u32]) -> Result<()> {
        if n_rows == 0 {
            return Ok(());
        }
        let dst = self.small_scratch(n_rows * 4)?;
        self.launch("sampling", "argmax_f32", (n_rows as u32, 1, 1), 1024, 0, Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(dst).ptr(0))?;
        let g = self.small.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().expect("scratch allocated above").mem.read(0, &mut out[..n_rows])
    }
}
