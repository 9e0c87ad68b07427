//! Argmax and the greedy step on the device (`rust/kernels/sampling.cu`): only the winning ids
//! (and their log-probabilities) come back to the host.

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

    /// The greedy step: argmax and its log-softmax per row on the device (`greedy_partial_f32`
    /// over slices of the row, then `greedy_final_f32`); one copy of `2 · n_rows` numbers comes
    /// back.
    pub(crate) fn op_greedy(&self, x: &CudaBuffer, n_rows: usize, n_cols: usize, tokens: &mut [u32], logprobs: &mut [f32]) -> Result<()> {
        if n_rows == 0 {
            return Ok(());
        }
        if n_rows * n_cols > x.len || tokens.len() < n_rows || logprobs.len() < n_rows {
            return Err(crate::FakError::invalid("greedy_rows", format!("{n_rows} rows of {n_cols} exceed the buffers")));
        }
        // Slices of ≥ 1024 columns, at most 128 per row; the partials (16 bytes each) follow the
        // 2 · n_rows results in the scratch, 16-byte aligned.
        let slices = n_cols.div_ceil(1024).clamp(1, 128);
        let part_off = (8 * n_rows).next_multiple_of(16);
        let dst = self.small_scratch(part_off + 16 * slices * n_rows)?;
        let part = dst + part_off as u64;
        self.launch("sampling", "greedy_partial_f32", (slices as u32, n_rows as u32, 1), 256, 0, Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(part))?;
        self.launch("sampling", "greedy_final_f32", (n_rows as u32, 1, 1), 32, 0, Args::new().ptr(part).i32(slices as i32).ptr(dst).ptr(dst + 4 * n_rows as u64))?;
        let mut both = vec![0u32; 2 * n_rows];
        let g = self.small.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().expect("scratch allocated above").mem.read(0, &mut both)?;
        tokens[..n_rows].copy_from_slice(&both[..n_rows]);
        for (l, b) in logprobs[..n_rows].iter_mut().zip(&both[n_rows..]) {
            *l = f32::from_bits(*b);
        }
        Ok(())
    }
}
