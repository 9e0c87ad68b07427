//! Paged KV-cache bookkeeping (vLLM's PagedAttention block manager, Kwon et al. 2023): a pool of
//! fixed-size blocks of token slots and, per sequence, a block table mapping logical block `i`
//! (positions `i·block_size ..`) to a physical block. Blocks are taken on demand as a sequence
//! grows and returned when it is removed or preempted. The storage itself belongs to the backend
//! (`Backend::KvCache`); this is host-side accounting only.

use crate::{FakError, Result};

/// The free list of physical KV blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    n_blocks: usize,
    /// Free physical block ids; the most recently freed is reused first (its memory is warm).
    free: Vec<u32>,
}

impl BlockPool {
    /// A pool of `n_blocks` blocks of `block_size` tokens, all free.
    pub fn new(n_blocks: usize, block_size: usize) -> BlockPool {
        assert!(block_size > 0, "block_size must be positive");
        BlockPool {
            block_size,
            n_blocks,
            free: (0..n_blocks as u32).rev().collect(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn n_total(&self) -> usize {
        self.n_blocks
    }

    /// Blocks not held by any sequence.
    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks held by sequences.
    pub fn n_used(&self) -> usize {
        self.n_blocks - self.free.len()
    }

    /// Blocks needed to hold `n_tokens` tokens.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// Grows `table` until it covers `n_tokens` positions. All or nothing: when the pool has too
    /// few free blocks, nothing is taken and [`FakError::KvCacheFull`] says how many were missing.
    pub fn grow(&mut self, table: &mut Vec<u32>, n_tokens: usize) -> Result<()> {
        let needed = self.blocks_for(n_tokens).saturating_sub(table.len());
        if needed > self.free.len() {
            return Err(FakError::KvCacheFull {
                needed,
                free: self.free.len(),
            });
        }
        for _ in 0..needed {
            table.push(self.free.pop().expect("checked above"));
        }
        Ok(())
    }

    /// Returns every block of `table` to the pool and empties it.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        debug_assert!(table.iter().all(|&b| (b as usize) < self.n_blocks));
        self.free.extend(table.drain(..).rev());
        debug_assert!(
            self.free.len() <= self.n_blocks,
            "a block was released twice"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_release_and_stats() {
        let mut pool = BlockPool::new(8, 16);
        assert_eq!((pool.n_total(), pool.n_free(), pool.n_used()), (8, 8, 0));
        let mut a = Vec::new();
        pool.grow(&mut a, 1).unwrap();
        assert_eq!(a.len(), 1);
        pool.grow(&mut a, 16).unwrap();
        assert_eq!(a.len(), 1, "16 tokens still fit one block");
        pool.grow(&mut a, 17).unwrap();
        assert_eq!(a.len(), 2);
        let mut b = Vec::new();
        pool.grow(&mut b, 6 * 16).unwrap();
        assert_eq!(pool.n_free(), 0);
        let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 8, "blocks are distinct");
        // Out of blocks: nothing is taken.
        match pool.grow(&mut a, 33) {
            Err(FakError::KvCacheFull { needed: 1, free: 0 }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(a.len(), 2);
        pool.release(&mut b);
        assert!(b.is_empty());
        assert_eq!((pool.n_free(), pool.n_used()), (6, 2));
        pool.grow(&mut a, 8 * 16).unwrap();
        assert_eq!(pool.n_free(), 0);
        pool.release(&mut a);
        assert_eq!(pool.n_free(), 8);
    }

    #[test]
    fn all_or_nothing() {
        let mut pool = BlockPool::new(3, 4);
        let mut t = Vec::new();
        assert!(pool.grow(&mut t, 13).is_err());
        assert!(t.is_empty());
        assert_eq!(pool.n_free(), 3);
        pool.grow(&mut t, 12).unwrap();
        assert_eq!(t.len(), 3);
    }
}
