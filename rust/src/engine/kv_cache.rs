//! Paged KV-cache bookkeeping with automatic prefix caching: a pool of fixed-size blocks of token
//! slots with reference counts, and, per sequence, a block table mapping logical block `i`
//! (positions `i·block_size ..`) to a physical block. The storage itself belongs to the backend
//! (`Backend::KvCache`); this is host-side accounting only.
//!
//! Sources: vLLM's PagedAttention block manager (Kwon et al. 2023) for the paging, and vLLM v1's
//! automatic prefix caching (`vllm/v1/core/block_pool.py`, `kv_cache_utils.py`) for the cache:
//! - A full block whose K/V has been computed is identified by a chained hash,
//!   `hash(parent block's hash, the block's token ids)`, so equal hashes mean equal token prefixes
//!   up to and including the block (nothing else changes K/V content in fak: one model per pool).
//!   The hasher is SipHash keyed at random per pool; a hit is also checked against the stored
//!   token ids and parent hash, so a hash collision can never return the wrong K/V.
//! - Blocks carry reference counts. A block nobody references is free; a free block that still
//!   holds a cached hash stays findable until the pool needs a block and evicts it.
//! - The free list is in eviction order (a doubly-linked list over block ids, O(1) removal when a
//!   cached free block is hit): blocks without a hash at the front (nothing is lost by reusing
//!   them), cached blocks behind them from least to most recently freed; a sequence's blocks are
//!   freed last block first, so its tail is evicted before its shared head.
//! - Sharing is read-only: only full, computed blocks are cached, and a sequence only writes
//!   positions at or after its first uncached position, which always lie in blocks it owns alone.
//! - Sliding windows: a sequence of a model whose every layer is windowed returns the blocks wholly
//!   before its window to the pool as it advances (`Sequence::release_outside_window`); their
//!   block-table entries become [`NO_BLOCK`], which [`BlockPool::release`] skips. A released block
//!   is released like any other: if it is cached, it keeps its K/V and stays findable until the
//!   pool evicts it (and eviction drops its hash, so a block that was overwritten is never
//!   matched); if not, it is reused first.
//! - Resident prefixes ([`BlockPool::mark_resident`]): the cached blocks of a prefix its caller
//!   names as worth keeping (an agent's system prompt and tools, which every request of that
//!   agent repeats) get [`RESIDENT_CHANCES`] second chances: when eviction reaches such a block it
//!   goes to the back of the free list instead, one chance fewer (CLOCK's second chance over the
//!   LRU). A main agent's prefix and its sub-agents' then outlive the dead tails of finished
//!   conversations under memory pressure; a prefix nobody repeats loses its chances and goes.
//! - Quarantine ([`BlockPool::quarantine`]): blocks whose tokens include a span found poisoned,
//!   and every cached block whose chain passes through them, leave the cache; their hashes are
//!   banned, so the same chain is never cached or matched again (a block whose parent is banned is
//!   banned when offered). Sequences holding such blocks keep them (the engine rewrites those
//!   sequences, see `Engine::quarantine_span`).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

pub use crate::backend::NO_BLOCK;
use crate::{FakError, Result};

/// The chained hash of a full KV block (see the module doc).
pub type BlockHash = u64;

/// "No block" in the free-list links.
const NIL: u32 = u32::MAX;

/// Times eviction passes over a block of a resident prefix before taking it (see the module doc).
pub const RESIDENT_CHANCES: u8 = 2;

#[derive(Debug, Clone)]
struct BlockMeta {
    /// Sequences (and `Engine::logits` calls) holding the block.
    ref_cnt: u32,
    /// Set while the block is in the prefix cache.
    hash: Option<BlockHash>,
    /// The parent hash the block was cached under (checked on every hit).
    parent: Option<BlockHash>,
    /// Free-list links; meaningful only while `ref_cnt == 0`.
    prev: u32,
    next: u32,
    /// Second chances left before eviction takes this cached block ([`BlockPool::mark_resident`]).
    chances: u8,
}

/// The physical KV blocks: reference counts, the free list in eviction order and the prefix cache.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    n_blocks: usize,
    meta: Vec<BlockMeta>,
    /// Token ids of every cached block, `[n_blocks · block_size]` (verifies hits).
    tokens: Vec<u32>,
    /// Free list: `head` is reused (or evicted) first.
    head: u32,
    tail: u32,
    n_free: usize,
    /// Cached blocks by hash (one block per hash; a duplicate computed concurrently stays private).
    cached: HashMap<BlockHash, u32>,
    hasher: RandomState,
    prefix_caching: bool,
    /// Hashes of quarantined blocks and of blocks chained after them: never cached again.
    banned: HashSet<BlockHash>,
}

impl BlockPool {
    /// A pool of `n_blocks` blocks of `block_size` tokens, all free. `prefix_caching` turns the
    /// prefix cache on; off, the pool only pages (nothing is hashed or found, and freed blocks
    /// are reused most recently freed first).
    pub fn new(n_blocks: usize, block_size: usize, prefix_caching: bool) -> BlockPool {
        assert!(block_size > 0, "block_size must be positive");
        assert!(n_blocks < NIL as usize, "too many KV blocks");
        let meta = (0..n_blocks as u32)
            .map(|b| BlockMeta {
                ref_cnt: 0,
                hash: None,
                parent: None,
                prev: if b == 0 { NIL } else { b - 1 },
                next: if b as usize + 1 == n_blocks { NIL } else { b + 1 },
                chances: 0,
            })
            .collect();
        BlockPool {
            block_size,
            n_blocks,
            meta,
            tokens: if prefix_caching {
                vec![0; n_blocks * block_size]
            } else {
                Vec::new()
            },
            head: if n_blocks == 0 { NIL } else { 0 },
            tail: if n_blocks == 0 { NIL } else { n_blocks as u32 - 1 },
            n_free: n_blocks,
            cached: HashMap::new(),
            hasher: RandomState::new(),
            prefix_caching,
            banned: HashSet::new(),
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

    /// Blocks not held by any sequence (cached ones included: they are evicted on demand).
    pub fn n_free(&self) -> usize {
        self.n_free
    }

    /// Blocks held by sequences.
    pub fn n_used(&self) -> usize {
        self.n_blocks - self.n_free
    }

    /// Blocks in the prefix cache (held or free).
    pub fn n_cached(&self) -> usize {
        self.cached.len()
    }

    /// Whether the prefix cache is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks needed to hold `n_tokens` tokens.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// References held on `block`.
    pub fn ref_count(&self, block: u32) -> u32 {
        self.meta[block as usize].ref_cnt
    }

    /// Whether `block` is in the prefix cache.
    pub fn is_cached(&self, block: u32) -> bool {
        self.meta[block as usize].hash.is_some()
    }

    /// The chained hash of a full block of `tokens` (`block_size` ids) after the block hashed
    /// `parent` (`None` for the first block of a sequence).
    pub fn hash_block(&self, parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        debug_assert_eq!(tokens.len(), self.block_size);
        let mut h = self.hasher.build_hasher();
        match parent {
            None => h.write_u8(0),
            Some(p) => {
                h.write_u8(1);
                h.write_u64(p);
            }
        }
        for &t in tokens {
            h.write_u32(t);
        }
        h.finish()
    }

    /// The cached block holding `tokens` after the prefix hashed `parent`, if any (`hash` is
    /// [`Self::hash_block`] of the two). Takes no reference; see [`Self::touch`].
    pub fn lookup(&self, hash: BlockHash, parent: Option<BlockHash>, tokens: &[u32]) -> Option<u32> {
        if !self.prefix_caching {
            return None;
        }
        let &b = self.cached.get(&hash)?;
        let m = &self.meta[b as usize];
        let bs = self.block_size;
        let same = m.hash == Some(hash)
            && m.parent == parent
            && self.tokens[b as usize * bs..(b as usize + 1) * bs] == *tokens;
        same.then_some(b)
    }

    /// Takes a reference on `block` (a prefix-cache hit), taking it off the free list if nobody
    /// held it.
    pub fn touch(&mut self, block: u32) {
        if self.meta[block as usize].ref_cnt == 0 {
            self.unlink(block);
        }
        self.meta[block as usize].ref_cnt += 1;
    }

    /// Puts `block`, a full block whose K/V for `tokens` (hashed `hash` after `parent`) has been
    /// computed, into the prefix cache. Returns false when it was not added: the cache is off, the
    /// block is cached already (it came from a hit), or another block holds the same hash.
    pub fn register(
        &mut self,
        block: u32,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> bool {
        debug_assert!(self.meta[block as usize].ref_cnt > 0, "registering a free block");
        debug_assert_eq!(tokens.len(), self.block_size);
        if !self.prefix_caching || self.meta[block as usize].hash.is_some() {
            return false;
        }
        if self.banned.contains(&hash) || parent.is_some_and(|p| self.banned.contains(&p)) {
            self.banned.insert(hash);
            return false;
        }
        if self.cached.contains_key(&hash) {
            return false;
        }
        self.cached.insert(hash, block);
        let m = &mut self.meta[block as usize];
        m.hash = Some(hash);
        m.parent = parent;
        let bs = self.block_size;
        self.tokens[block as usize * bs..(block as usize + 1) * bs].copy_from_slice(tokens);
        true
    }

    /// Cached blocks that follow the prefix hashed `parent` (`None`: the first block of a
    /// sequence) and whose tokens start with `head` (at most `block_size` ids): the blocks that
    /// hold those positions for any sequence with that prefix. Takes no reference.
    pub fn cached_children(&self, parent: Option<BlockHash>, head: &[u32]) -> Vec<u32> {
        let bs = self.block_size;
        let head = &head[..head.len().min(bs)];
        let mut out: Vec<u32> = self
            .cached
            .values()
            .copied()
            .filter(|&b| {
                let m = &self.meta[b as usize];
                m.parent == parent
                    && self.tokens[b as usize * bs..b as usize * bs + head.len()] == *head
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Takes `roots` and every cached block chained after them out of the prefix cache and bans
    /// their hashes (see the module doc). Blocks nobody holds become plain free blocks (reused
    /// first); their token copies are zeroed. Blocks in `roots` that are not cached are ignored.
    /// Returns how many blocks left the cache.
    pub fn quarantine(&mut self, roots: &[u32]) -> usize {
        let mut children: HashMap<BlockHash, Vec<u32>> = HashMap::new();
        for &b in self.cached.values() {
            if let Some(p) = self.meta[b as usize].parent {
                children.entry(p).or_default().push(b);
            }
        }
        let mut stack: Vec<u32> = roots
            .iter()
            .copied()
            .filter(|&b| self.meta[b as usize].hash.is_some())
            .collect();
        let mut n = 0;
        while let Some(b) = stack.pop() {
            let Some(h) = self.meta[b as usize].hash.take() else {
                continue;
            };
            self.meta[b as usize].parent = None;
            self.meta[b as usize].chances = 0;
            self.cached.remove(&h);
            self.banned.insert(h);
            let bs = self.block_size;
            self.tokens[b as usize * bs..(b as usize + 1) * bs].fill(0);
            if self.meta[b as usize].ref_cnt == 0 {
                self.unlink(b);
                self.push_front(b);
            }
            n += 1;
            if let Some(kids) = children.remove(&h) {
                stack.extend(kids);
            }
        }
        n
    }

    /// Bans `hash` (cached or not) and takes its block, if cached, and every cached block chained
    /// after it out of the cache ([`Self::quarantine`]): the chain through `hash` is never cached
    /// or matched again. Returns how many blocks left the cache.
    pub fn ban(&mut self, hash: BlockHash) -> usize {
        self.banned.insert(hash);
        // its block if cached, else the cached blocks chained right after it (the block itself
        // may have been evicted while they stayed)
        let roots: Vec<u32> = match self.cached.get(&hash).copied() {
            Some(b) => vec![b],
            None => self.cached.values().copied().filter(|&b| self.meta[b as usize].parent == Some(hash)).collect(),
        };
        self.quarantine(&roots)
    }

    /// Whether `hash` is banned by a quarantine.
    pub fn is_banned(&self, hash: BlockHash) -> bool {
        self.banned.contains(&hash)
    }

    /// `(hash, parent, token ids)` of every cached block, in block order (for tests and audits:
    /// what the prefix cache holds).
    pub fn cached_blocks(&self) -> Vec<(BlockHash, Option<BlockHash>, Vec<u32>)> {
        let bs = self.block_size;
        let mut blocks: Vec<u32> = self.cached.values().copied().collect();
        blocks.sort_unstable();
        blocks
            .into_iter()
            .map(|b| {
                let m = &self.meta[b as usize];
                (
                    m.hash.expect("cached block has a hash"),
                    m.parent,
                    self.tokens[b as usize * bs..(b as usize + 1) * bs].to_vec(),
                )
            })
            .collect()
    }

    /// Drops one reference on each block of `table` from logical block `keep` on and truncates
    /// `table` to `keep` blocks (see [`Self::release`] for where freed blocks go).
    pub fn release_tail(&mut self, table: &mut Vec<u32>, keep: usize) {
        if keep >= table.len() {
            return;
        }
        let mut tail = table.split_off(keep);
        self.release(&mut tail);
    }

    /// Grows `table` until it covers `n_tokens` positions with new private blocks (evicting
    /// cached free blocks as needed, least recently freed first). All or nothing: when the pool
    /// has too few free blocks, nothing is taken and [`FakError::KvCacheFull`] says how many were
    /// missing.
    pub fn grow(&mut self, table: &mut Vec<u32>, n_tokens: usize) -> Result<()> {
        let needed = self.blocks_for(n_tokens).saturating_sub(table.len());
        if needed > self.n_free {
            return Err(FakError::KvCacheFull {
                needed,
                free: self.n_free,
            });
        }
        for _ in 0..needed {
            let mut b = self.head;
            debug_assert_ne!(b, NIL);
            // A resident prefix's block gets a second chance: to the back, one chance fewer
            // (chances are finite, so this ends).
            while self.meta[b as usize].chances > 0 && self.n_free > 1 {
                self.meta[b as usize].chances -= 1;
                self.unlink(b);
                self.push_back(b);
                b = self.head;
            }
            self.unlink(b);
            let m = &mut self.meta[b as usize];
            if let Some(h) = m.hash.take() {
                m.parent = None;
                self.cached.remove(&h);
            }
            m.chances = 0;
            m.ref_cnt = 1;
            table.push(b);
        }
        Ok(())
    }

    /// Marks the cached blocks of `blocks` (a sequence's leading blocks that hold a prefix its
    /// caller wants kept: [`NO_BLOCK`] and uncached blocks are skipped) as resident: eviction
    /// passes over each [`RESIDENT_CHANCES`] times before taking it. Marking again renews the
    /// chances. Returns how many blocks were marked.
    pub fn mark_resident(&mut self, blocks: &[u32]) -> usize {
        let mut n = 0;
        for &b in blocks {
            if b != NO_BLOCK && self.meta[b as usize].hash.is_some() {
                self.meta[b as usize].chances = RESIDENT_CHANCES;
                n += 1;
            }
        }
        n
    }

    /// Cached blocks that are resident (with second chances left).
    pub fn n_resident(&self) -> usize {
        self.meta.iter().filter(|m| m.chances > 0 && m.hash.is_some()).count()
    }

    /// Drops one reference on every block of `table` and empties it ([`NO_BLOCK`] entries, blocks
    /// released already, are skipped). Blocks nobody holds any more become free: uncached ones at
    /// the front of the free list, cached ones at its back (the table's last block first, so a
    /// sequence's tail is evicted before its head).
    pub fn release(&mut self, table: &mut Vec<u32>) {
        for b in table.drain(..).rev() {
            if b != NO_BLOCK {
                self.release_one(b);
            }
        }
    }

    /// Drops one reference on `block` (see [`Self::release`] for where a freed block goes).
    pub fn release_one(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        assert!(m.ref_cnt > 0, "KV block {b} released more often than taken");
        m.ref_cnt -= 1;
        if m.ref_cnt == 0 {
            if m.hash.is_some() {
                self.push_back(b);
            } else {
                self.push_front(b);
            }
        }
    }

    fn unlink(&mut self, b: u32) {
        let (prev, next) = {
            let m = &self.meta[b as usize];
            (m.prev, m.next)
        };
        if prev == NIL {
            debug_assert_eq!(self.head, b);
            self.head = next;
        } else {
            self.meta[prev as usize].next = next;
        }
        if next == NIL {
            debug_assert_eq!(self.tail, b);
            self.tail = prev;
        } else {
            self.meta[next as usize].prev = prev;
        }
        let m = &mut self.meta[b as usize];
        m.prev = NIL;
        m.next = NIL;
        self.n_free -= 1;
    }

    fn push_front(&mut self, b: u32) {
        let old = self.head;
        {
            let m = &mut self.meta[b as usize];
            m.prev = NIL;
            m.next = old;
        }
        if old == NIL {
            self.tail = b;
        } else {
            self.meta[old as usize].prev = b;
        }
        self.head = b;
        self.n_free += 1;
    }

    fn push_back(&mut self, b: u32) {
        let old = self.tail;
        {
            let m = &mut self.meta[b as usize];
            m.next = NIL;
            m.prev = old;
        }
        if old == NIL {
            self.head = b;
        } else {
            self.meta[old as usize].next = b;
        }
        self.tail = b;
        self.n_free += 1;
    }

    /// The free list, first to be reused first (for tests and debugging).
    pub fn free_blocks(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.n_free);
        let mut b = self.head;
        while b != NIL && out.len() <= self.n_blocks {
            out.push(b);
            b = self.meta[b as usize].next;
        }
        out
    }

    /// Checks the pool's invariants against `held`, the expected reference count of every block
    /// (summed over the block tables of all holders): the free list holds exactly the blocks with
    /// no reference, once each, linked both ways; every cached hash points to a block carrying it.
    /// Returns the first violation found.
    pub fn check(&self, held: &[u32]) -> std::result::Result<(), String> {
        if held.len() != self.n_blocks {
            return Err(format!("{} counts for {} blocks", held.len(), self.n_blocks));
        }
        for (b, (&want, m)) in held.iter().zip(&self.meta).enumerate() {
            if m.ref_cnt != want {
                return Err(format!("block {b}: ref_cnt {} but {want} holders", m.ref_cnt));
            }
        }
        let free = self.free_blocks();
        if free.len() != self.n_free {
            return Err(format!("free list has {} blocks, n_free says {}", free.len(), self.n_free));
        }
        let mut seen = vec![false; self.n_blocks];
        let mut prev = NIL;
        for &b in &free {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("block {b} is twice on the free list"));
            }
            if self.meta[b as usize].ref_cnt != 0 {
                return Err(format!("block {b} is free but referenced"));
            }
            if self.meta[b as usize].prev != prev {
                return Err(format!("block {b}: broken back link"));
            }
            prev = b;
        }
        if self.tail != prev {
            return Err("free-list tail is not its last block".into());
        }
        if let Some(b) = (0..self.n_blocks).find(|&b| self.meta[b].ref_cnt == 0 && !seen[b]) {
            return Err(format!("block {b} has no reference but is not free"));
        }
        for (&h, &b) in &self.cached {
            if self.meta[b as usize].hash != Some(h) {
                return Err(format!("cached hash {h:#x} points to block {b}, which does not carry it"));
            }
        }
        let hashed = self.meta.iter().filter(|m| m.hash.is_some()).count();
        if hashed != self.cached.len() {
            return Err(format!("{hashed} blocks carry a hash, {} are cached", self.cached.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(pool: &BlockPool, tables: &[&Vec<u32>]) -> Vec<u32> {
        let mut h = vec![0; pool.n_total()];
        for t in tables {
            for &b in t.iter().filter(|&&b| b != NO_BLOCK) {
                h[b as usize] += 1;
            }
        }
        h
    }

    #[test]
    fn released_window_blocks_are_skipped_and_stay_findable() {
        let mut pool = BlockPool::new(4, 2, true);
        let toks = [1u32, 2, 3, 4, 5, 6];
        let mut t = Vec::new();
        pool.grow(&mut t, 6).unwrap();
        let h0 = pool.hash_block(None, &toks[0..2]);
        assert!(pool.register(t[0], h0, None, &toks[0..2]));
        // The window moved past block 0: released, NO_BLOCK in the table.
        let b0 = std::mem::replace(&mut t[0], NO_BLOCK);
        pool.release_one(b0);
        assert_eq!((pool.n_free(), pool.ref_count(b0)), (2, 0));
        pool.check(&held(&pool, &[&t])).unwrap();
        // Still cached: a later sequence with the same first block finds it.
        assert_eq!(pool.lookup(h0, None, &toks[0..2]), Some(b0));
        // Releasing the rest of the table skips the NO_BLOCK entry.
        pool.release(&mut t);
        pool.check(&[0; 4]).unwrap();
        // Once evicted (overwritten by another sequence) it is never found again.
        let mut u = Vec::new();
        pool.grow(&mut u, 8).unwrap();
        assert_eq!(pool.lookup(h0, None, &toks[0..2]), None);
        pool.release(&mut u);
    }

    #[test]
    fn grow_release_and_stats() {
        for caching in [false, true] {
            let mut pool = BlockPool::new(8, 16, caching);
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
            pool.check(&held(&pool, &[&a, &b])).unwrap();
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
            pool.check(&[0; 8]).unwrap();
        }
    }

    #[test]
    fn all_or_nothing() {
        let mut pool = BlockPool::new(3, 4, true);
        let mut t = Vec::new();
        assert!(pool.grow(&mut t, 13).is_err());
        assert!(t.is_empty());
        assert_eq!(pool.n_free(), 3);
        pool.grow(&mut t, 12).unwrap();
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn uncached_blocks_are_reused_most_recent_first() {
        let mut pool = BlockPool::new(4, 4, false);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        pool.grow(&mut a, 8).unwrap();
        pool.grow(&mut b, 4).unwrap();
        assert_eq!((a.clone(), b.clone()), (vec![0, 1], vec![2]));
        pool.release(&mut a);
        // Released last block first, each to the front: 0 is reused first (its memory is warm).
        assert_eq!(pool.free_blocks(), vec![0, 1, 3]);
        pool.grow(&mut a, 4).unwrap();
        assert_eq!(a, vec![0]);
    }

    #[test]
    fn hash_chain_depends_on_parent_and_tokens() {
        let pool = BlockPool::new(4, 4, true);
        let x = [1, 2, 3, 4];
        let h0 = pool.hash_block(None, &x);
        assert_eq!(h0, pool.hash_block(None, &x), "deterministic within a pool");
        assert_ne!(h0, pool.hash_block(None, &[1, 2, 3, 5]));
        assert_ne!(h0, pool.hash_block(None, &[2, 1, 3, 4]), "order matters");
        let h1 = pool.hash_block(Some(h0), &x);
        assert_ne!(h1, h0, "the same tokens after a prefix hash differently");
        assert_ne!(h1, pool.hash_block(Some(h0 ^ 1), &x));
        // A parent hash of 0 is not the same as no parent.
        assert_ne!(pool.hash_block(Some(0), &x), h0);
    }

    #[test]
    fn register_lookup_touch_and_refcounts() {
        let mut pool = BlockPool::new(6, 4, true);
        let toks: Vec<u32> = (0..12).collect();
        let mut a = Vec::new();
        pool.grow(&mut a, 10).unwrap(); // 3 blocks, the last one partial
        let h0 = pool.hash_block(None, &toks[0..4]);
        let h1 = pool.hash_block(Some(h0), &toks[4..8]);
        assert!(pool.register(a[0], h0, None, &toks[0..4]));
        assert!(pool.register(a[1], h1, Some(h0), &toks[4..8]));
        assert!(!pool.register(a[1], h1, Some(h0), &toks[4..8]), "already cached");
        assert_eq!(pool.n_cached(), 2);
        // Lookups verify parent and tokens, not just the hash.
        assert_eq!(pool.lookup(h0, None, &toks[0..4]), Some(a[0]));
        assert_eq!(pool.lookup(h1, Some(h0), &toks[4..8]), Some(a[1]));
        assert_eq!(pool.lookup(h1, None, &toks[4..8]), None, "wrong parent");
        assert_eq!(pool.lookup(h1, Some(h0), &toks[0..4]), None, "wrong tokens");
        assert_eq!(pool.lookup(h1 ^ 1, Some(h0), &toks[4..8]), None);
        // A second holder shares the two full blocks.
        let mut b = vec![];
        for &blk in &a[..2] {
            pool.touch(blk);
            b.push(blk);
        }
        pool.grow(&mut b, 12).unwrap();
        assert_eq!(b.len(), 3);
        assert_ne!(b[2], a[2], "the partial block is private");
        assert_eq!((pool.ref_count(a[0]), pool.ref_count(a[1]), pool.ref_count(a[2])), (2, 2, 1));
        pool.check(&held(&pool, &[&a, &b])).unwrap();
        assert_eq!(pool.n_used(), 4);
        // Releasing one holder keeps the shared blocks held.
        let a_blocks = a.clone();
        pool.release(&mut a);
        assert_eq!((pool.ref_count(a_blocks[0]), pool.ref_count(a_blocks[2])), (1, 0));
        pool.check(&held(&pool, &[&b])).unwrap();
        // Releasing the last holder: the cached blocks stay findable while free.
        pool.release(&mut b);
        assert_eq!(pool.n_free(), 6);
        assert_eq!(pool.n_cached(), 2);
        assert_eq!(pool.lookup(h1, Some(h0), &toks[4..8]), Some(a_blocks[1]));
        pool.check(&[0; 6]).unwrap();
        // A hit on a free cached block takes it off the free list.
        pool.touch(a_blocks[0]);
        assert_eq!((pool.n_free(), pool.ref_count(a_blocks[0])), (5, 1));
        let mut c = vec![a_blocks[0]];
        pool.check(&held(&pool, &[&c])).unwrap();
        pool.release(&mut c);
        pool.check(&[0; 6]).unwrap();
    }

    #[test]
    fn duplicate_hash_stays_private() {
        let mut pool = BlockPool::new(4, 4, true);
        let toks = [7u32, 7, 7, 7];
        let h = pool.hash_block(None, &toks);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        pool.grow(&mut a, 4).unwrap();
        pool.grow(&mut b, 4).unwrap();
        assert!(pool.register(a[0], h, None, &toks));
        assert!(!pool.register(b[0], h, None, &toks), "one block per hash");
        assert!(!pool.is_cached(b[0]));
        pool.release(&mut b);
        pool.release(&mut a);
        assert_eq!(pool.n_cached(), 1);
        pool.check(&[0; 4]).unwrap();
    }

    #[test]
    fn eviction_is_lru_and_uncached_blocks_go_first() {
        let mut pool = BlockPool::new(6, 2, true);
        // Three sequences of two full, cached blocks each, freed in the order s0, s1, s2.
        let mut tables = Vec::new();
        let mut hashes = Vec::new();
        for s in 0..3u32 {
            let mut t = Vec::new();
            pool.grow(&mut t, 4).unwrap();
            let h0 = pool.hash_block(None, &[s, 0]);
            let h1 = pool.hash_block(Some(h0), &[s, 1]);
            assert!(pool.register(t[0], h0, None, &[s, 0]));
            assert!(pool.register(t[1], h1, Some(h0), &[s, 1]));
            hashes.push((h0, h1));
            tables.push(t);
        }
        let blocks: Vec<Vec<u32>> = tables.clone();
        for t in &mut tables {
            pool.release(t);
        }
        // LRU order; within a sequence the tail block before the head block.
        assert_eq!(
            pool.free_blocks(),
            vec![blocks[0][1], blocks[0][0], blocks[1][1], blocks[1][0], blocks[2][1], blocks[2][0]]
        );
        // Hit s1's head: it leaves the free list; freed again it becomes most recent.
        let (h0, _) = hashes[1];
        let b = pool.lookup(h0, None, &[1, 0]).unwrap();
        let mut t = vec![b];
        pool.touch(b);
        pool.release(&mut t);
        assert_eq!(*pool.free_blocks().last().unwrap(), b);
        // An uncached block released goes to the front and is reused before any cached one.
        let mut u = Vec::new();
        pool.grow(&mut u, 2).unwrap(); // evicts s0's tail
        assert_eq!(u, vec![blocks[0][1]]);
        assert_eq!(pool.n_cached(), 5);
        let (h0, h1) = hashes[0];
        assert_eq!(pool.lookup(h1, Some(h0), &[0, 1]), None, "evicted");
        assert!(pool.lookup(h0, None, &[0, 0]).is_some(), "the head survives its tail");
        pool.release(&mut u);
        assert_eq!(pool.free_blocks()[0], blocks[0][1]);
        let mut v = Vec::new();
        pool.grow(&mut v, 2).unwrap();
        assert_eq!(v, vec![blocks[0][1]], "the uncached block is reused, nothing else evicted");
        assert_eq!(pool.n_cached(), 5);
        // Filling the pool evicts everything, in order; the cache empties.
        pool.grow(&mut v, 12).unwrap();
        assert_eq!(pool.n_cached(), 0);
        assert_eq!(pool.n_free(), 0);
        pool.check(&held(&pool, &[&v])).unwrap();
        pool.release(&mut v);
        pool.check(&[0; 6]).unwrap();
    }

    #[test]
    fn resident_blocks_outlive_older_dead_tails() {
        // Four cached blocks freed oldest first: r (resident), a, b, c. Eviction takes a, b, c
        // before r; r then goes after its chances are spent.
        let mut pool = BlockPool::new(4, 2, true);
        let mut t = Vec::new();
        pool.grow(&mut t, 8).unwrap();
        let mut parent = None;
        for (i, &b) in t.iter().enumerate() {
            let toks = [i as u32, 7];
            let h = pool.hash_block(parent, &toks);
            assert!(pool.register(b, h, parent, &toks));
            parent = Some(h);
        }
        let (r, rest) = (t[0], t[1..].to_vec());
        assert_eq!(pool.mark_resident(&[r, NO_BLOCK]), 1);
        assert_eq!(pool.n_resident(), 1);
        for &b in std::iter::once(&r).chain(rest.iter()) {
            pool.release_one(b);
        }
        assert_eq!(pool.free_blocks(), vec![r, rest[0], rest[1], rest[2]]);
        let mut u = Vec::new();
        pool.grow(&mut u, 6).unwrap();
        assert_eq!(u, rest, "the dead tails go first");
        assert!(pool.is_cached(r) && pool.n_resident() == 1);
        let mut v = Vec::new();
        pool.grow(&mut v, 2).unwrap();
        assert_eq!(v, vec![r], "a lone free block is taken whatever its chances");
        assert_eq!(pool.n_resident(), 0);
        pool.check(&[1, 1, 1, 1]).unwrap();
    }

    #[test]
    fn quarantine_drops_the_chain_and_bans_it() {
        let mut pool = BlockPool::new(8, 2, true);
        // Two sequences sharing block 0, diverging at block 1; a third unrelated one.
        let toks_a = [1u32, 2, 3, 4, 5, 6];
        let toks_b = [1u32, 2, 9, 9];
        let toks_c = [7u32, 7];
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        pool.grow(&mut a, 6).unwrap();
        let h0 = pool.hash_block(None, &toks_a[0..2]);
        let h1 = pool.hash_block(Some(h0), &toks_a[2..4]);
        let h2 = pool.hash_block(Some(h1), &toks_a[4..6]);
        assert!(pool.register(a[0], h0, None, &toks_a[0..2]));
        assert!(pool.register(a[1], h1, Some(h0), &toks_a[2..4]));
        assert!(pool.register(a[2], h2, Some(h1), &toks_a[4..6]));
        pool.touch(a[0]);
        b.push(a[0]);
        pool.grow(&mut b, 4).unwrap();
        let hb1 = pool.hash_block(Some(h0), &toks_b[2..4]);
        assert!(pool.register(b[1], hb1, Some(h0), &toks_b[2..4]));
        pool.grow(&mut c, 2).unwrap();
        let hc = pool.hash_block(None, &toks_c);
        assert!(pool.register(c[0], hc, None, &toks_c));
        pool.release(&mut c);
        assert_eq!(pool.n_cached(), 5);
        // A span starting at position 3 (inside block 1 of a): the children of block 0 whose
        // tokens start with a's [3, 4] are a[1] only.
        assert_eq!(pool.cached_children(Some(h0), &toks_a[2..4]), vec![a[1]]);
        assert_eq!(pool.cached_children(Some(h0), &toks_a[2..3]), vec![a[1]]);
        let a_blocks = a.clone();
        assert_eq!(pool.quarantine(&[a_blocks[1]]), 2, "a[1] and its child a[2]");
        assert_eq!(pool.n_cached(), 3);
        assert!(pool.lookup(h1, Some(h0), &toks_a[2..4]).is_none());
        assert!(pool.lookup(h2, Some(h1), &toks_a[4..6]).is_none());
        assert!(pool.lookup(h0, None, &toks_a[0..2]).is_some(), "the clean prefix stays");
        assert!(pool.lookup(hb1, Some(h0), &toks_b[2..4]).is_some(), "the sibling stays");
        assert!(pool.is_banned(h1) && pool.is_banned(h2));
        assert!(pool.cached_blocks().iter().all(|(_, _, t)| t.as_slice() != [3, 4] && t.as_slice() != [5, 6]));
        // Holders keep their blocks; released, they are plain free blocks reused first.
        pool.check(&held(&pool, &[&a, &b])).unwrap();
        pool.release(&mut a);
        assert_eq!(&pool.free_blocks()[..2], &[a_blocks[1], a_blocks[2]]);
        pool.check(&held(&pool, &[&b])).unwrap();
        // The banned chain is never cached again, nor anything chained after it.
        let mut d = Vec::new();
        pool.grow(&mut d, 6).unwrap();
        assert!(!pool.register(d[1], h1, Some(h0), &toks_a[2..4]));
        let h3 = pool.hash_block(Some(h1), &[8, 8]);
        assert!(!pool.register(d[2], h3, Some(h1), &[8, 8]));
        assert!(pool.is_banned(h3));
        // Free cached blocks are quarantined too (taken to the front of the free list).
        pool.release(&mut d);
        pool.release(&mut b);
        let roots = pool.cached_children(None, &toks_c);
        assert_eq!(pool.quarantine(&roots), 1);
        pool.check(&[0; 8]).unwrap();
        let mut tail = vec![];
        pool.grow(&mut tail, 8).unwrap();
        pool.release_tail(&mut tail, 1);
        assert_eq!(tail.len(), 1);
        pool.check(&held(&pool, &[&tail])).unwrap();
    }

    #[test]
    fn caching_off_finds_nothing() {
        let mut pool = BlockPool::new(2, 2, false);
        let mut t = Vec::new();
        pool.grow(&mut t, 2).unwrap();
        let h = pool.hash_block(None, &[1, 2]);
        assert!(!pool.register(t[0], h, None, &[1, 2]));
        assert_eq!(pool.lookup(h, None, &[1, 2]), None);
        assert_eq!(pool.n_cached(), 0);
    }
}
