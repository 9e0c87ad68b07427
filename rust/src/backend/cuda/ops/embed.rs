//! Embedding gather (`rust/kernels/embed.cu`): rows of token_embd dequantized from their blocks.

use super::super::launch::Args;
use super::super::{intern, kernel_fmt, CudaBackend, CudaBatch, CudaBuffer, CudaWeight};
use crate::{FakError, Result};

impl CudaBackend {
    pub(crate) fn op_embed(&self, table: &CudaWeight, batch: &CudaBatch, n_tokens: usize, out: &mut CudaBuffer) -> Result<()> {
        out.written();
        let (dim, n_vocab) = (table.k(), table.n_out());
        if let Some(&bad) = batch.plan.tokens[..n_tokens].iter().find(|&&t| t as usize >= n_vocab) {
            return Err(FakError::invalid("token_ids", format!("token id {bad} is out of range for a vocabulary of {n_vocab}")));
        }
        if dim % 8 != 0 {
            return Err(FakError::Unsupported(format!("the CUDA embedding gather needs n_embd % 8 == 0, not {dim}")));
        }
        let fmt = kernel_fmt(table.wtype).ok_or_else(|| FakError::Unsupported(format!("embedding table of type {}", table.wtype.name())))?;
        let name = intern(format!("embed_{fmt}_f32"));
        let threads = (dim / 8).next_multiple_of(32).clamp(32, 256) as u32;
        self.launch(
            "embed",
            name,
            (n_tokens as u32, 1, 1),
            threads,
            0,
            Args::new().ptr(table.mem.ptr()).u64(table.row_bytes as u64).ptr(batch.tokens()).ptr(out.ptr()).i32(dim as i32),
        )
    }
}
