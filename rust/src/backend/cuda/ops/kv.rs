//! KV cache write (`rust/kernels/kv.cu`): each row's K and V rounded to f16 into its slot.

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBatch, CudaBuffer, CudaKvCache};
use crate::Result;

impl CudaBackend {
    pub(crate) fn op_kv_write(&self, cache: &mut CudaKvCache, layer: usize, k: &CudaBuffer, v: &CudaBuffer, batch: &CudaBatch, n_rows: usize) -> Result<()> {
        let l = cache.layout;
        self.launch(
            "kv",
            "kv_write_f16",
            (n_rows as u32, 1, 1),
            128,
            0,
            Args::new()
                .ptr(k.ptr())
                .ptr(v.ptr())
                .ptr(batch.slots())
                .ptr(cache.k_layer(layer))
                .ptr(cache.v_layer(layer))
                .i32(l.n_head_kv as i32)
                .i32(l.head_dim as i32)
                .i32(l.block_size as i32),
        )
    }
}
