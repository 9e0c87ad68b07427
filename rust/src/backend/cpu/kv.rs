//! CPU storage of the paged KV cache: f16 K and V per layer (llama.cpp's default cache type),
//! laid out `[block][kv_head][slot][head_dim]` so that one KV head's keys of one block are
//! contiguous (`block_size · head_dim` values) for the attention inner loops.
//!
//! Memory comes from `alloc_zeroed` (calloc): pages are mapped lazily, so the resident set grows
//! with the blocks actually written, not with the configured capacity.

use rayon::prelude::*;

use super::vecops;
use crate::backend::{BatchPlan, KvLayout};
use crate::{FakError, Result};

/// K and V of every layer.
pub struct CpuKvCache {
    pub layout: KvLayout,
    /// Per layer, `n_blocks · n_head_kv · block_size · head_dim` f16 bit patterns.
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
    /// Per recurrent layer, `state_slots · state_len` f32: each slot one sequence's recurrent
    /// state (a hybrid model's Gated DeltaNet layers; empty otherwise).
    state: Vec<Vec<f32>>,
}

impl CpuKvCache {
    /// A zeroed cache of `layout` (lazily committed memory).
    ///
    /// Errors: [`FakError::InvalidArgument`] (`kv_cache_tokens`) when the size overflows.
    pub fn new(layout: KvLayout) -> Result<CpuKvCache> {
        let per_layer = layout
            .n_blocks
            .checked_mul(layout.n_head_kv)
            .and_then(|x| x.checked_mul(layout.block_size))
            .and_then(|x| x.checked_mul(layout.head_dim))
            .ok_or_else(|| FakError::invalid("kv_cache_tokens", "KV cache size overflows"))?;
        let alloc = || -> Result<Vec<Vec<u16>>> {
            (0..layout.n_layer)
                .map(|_| super::zeroed_vec::<u16>(per_layer, "the KV cache"))
                .collect()
        };
        let state_per_layer = layout
            .state_slots
            .checked_mul(layout.state_len)
            .ok_or_else(|| FakError::invalid("max_batch", "recurrent state size overflows"))?;
        let state = (0..layout.state_layers)
            .map(|_| super::zeroed_vec::<f32>(state_per_layer, "the recurrent state"))
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuKvCache {
            layout,
            k: alloc()?,
            v: alloc()?,
            state,
        })
    }

    /// Copies slot `from` of every state layer to slot `to`.
    pub fn copy_state(&mut self, from: usize, to: usize) {
        let n = self.layout.state_len;
        for layer in &mut self.state {
            layer.copy_within(from * n..(from + 1) * n, to * n);
        }
    }

    /// The recurrent state of slot `slot` in state layer `layer` (`state_len` f32).
    ///
    /// Panics when the slot or layer is outside the layout (a caller bug).
    pub fn state_mut(&mut self, layer: usize, slot: usize) -> &mut [f32] {
        let n = self.layout.state_len;
        &mut self.state[layer][slot * n..(slot + 1) * n]
    }

    /// The recurrent state of slot `slot` in state layer `layer` (`state_len` f32).
    ///
    /// Panics when the slot or layer is outside the layout (a caller bug).
    pub fn state(&self, layer: usize, slot: usize) -> &[f32] {
        let n = self.layout.state_len;
        &self.state[layer][slot * n..(slot + 1) * n]
    }

    /// Values per (block, KV head): `block_size · head_dim`.
    #[inline]
    pub fn head_block_len(&self) -> usize {
        self.layout.block_size * self.layout.head_dim
    }

    /// Keys of `layer`, physical block `block`, KV head `head`: `[block_size][head_dim]` f16 bits.
    #[inline]
    pub fn k_block(&self, layer: usize, block: usize, head: usize) -> &[u16] {
        let n = self.head_block_len();
        let off = (block * self.layout.n_head_kv + head) * n;
        &self.k[layer][off..off + n]
    }

    /// Values of `layer`, physical block `block`, KV head `head`: `[block_size][head_dim]` f16 bits.
    #[inline]
    pub fn v_block(&self, layer: usize, block: usize, head: usize) -> &[u16] {
        let n = self.head_block_len();
        let off = (block * self.layout.n_head_kv + head) * n;
        &self.v[layer][off..off + n]
    }

    /// Writes rows `0..n_rows` of `k` and `v` (`[n_rows, n_head_kv · head_dim]` f32) into the
    /// slots `plan.slots[r]` of `layer`, rounding to f16.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], plan: &BatchPlan, n_rows: usize) {
        let KvLayout {
            block_size,
            n_head_kv,
            head_dim,
            ..
        } = self.layout;
        let row = n_head_kv * head_dim;
        let n_head_block = self.head_block_len();
        let write_one = |dst: &mut [u16], src: &[f32]| {
            for r in 0..n_rows {
                let slot = plan.slots[r] as usize;
                let (block, off) = (slot / block_size, slot % block_size);
                for h in 0..n_head_kv {
                    let d0 = (block * n_head_kv + h) * n_head_block + off * head_dim;
                    vecops::f32_to_f16(
                        &src[r * row + h * head_dim..][..head_dim],
                        &mut dst[d0..d0 + head_dim],
                    );
                }
            }
        };
        let (kl, vl) = (&mut self.k[layer], &mut self.v[layer]);
        if n_rows * row >= 1 << 16 {
            rayon::join(|| write_one(kl, k), || write_one(vl, v));
        } else {
            write_one(kl, k);
            write_one(vl, v);
        }
    }

    /// Copies `layer`'s keys or values of `positions` of a sequence with `block_table` into an
    /// f32 array `[n, n_head_kv, head_dim]` (tests and debugging).
    pub fn read_positions(
        &self,
        layer: usize,
        values: bool,
        block_table: &[u32],
        positions: std::ops::Range<usize>,
    ) -> Vec<f32> {
        let KvLayout {
            block_size,
            n_head_kv,
            head_dim,
            ..
        } = self.layout;
        let mut out = vec![0f32; positions.len() * n_head_kv * head_dim];
        out.par_chunks_mut(n_head_kv * head_dim)
            .zip(positions)
            .for_each(|(o, p)| {
                let block = block_table[p / block_size] as usize;
                for h in 0..n_head_kv {
                    let src = if values {
                        self.v_block(layer, block, h)
                    } else {
                        self.k_block(layer, block, h)
                    };
                    vecops::f16_to_f32(
                        &src[(p % block_size) * head_dim..][..head_dim],
                        &mut o[h * head_dim..][..head_dim],
                    );
                }
            });
        out
    }
}
