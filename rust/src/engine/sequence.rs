//! One generation request inside the engine: its tokens, how many of them have K/V in the cache,
//! its block table, the chained hashes of its full blocks (prefix cache) and its sampler.
//!
//! Under a sliding window that covers every layer (`ModelConfig::kv_window`), the leading blocks of
//! the table that no later query can attend to are released as the sequence advances
//! ([`Sequence::release_outside_window`]): their entries become [`NO_BLOCK`], the table keeps its
//! logical indexing (entry `i` holds positions `i·block_size ..`).

use super::kv_cache::{BlockHash, BlockPool, NO_BLOCK};
use super::sampler::Sampler;
use super::speculative::{ConversationIndex, DraftControl, Drafter, SpecCounts, SpecParams};

/// A sequence (prompt plus generated tokens).
#[derive(Debug)]
pub struct Sequence {
    /// Caller's id.
    pub id: u64,
    /// Prompt followed by every generated token. The last generated token has no K/V yet: the
    /// next decode step computes it.
    pub tokens: Vec<u32>,
    /// Length of the prompt.
    pub n_prompt: usize,
    /// Tokens `0..n_cached` have K/V in the cache (the rest are pending).
    pub n_cached: usize,
    /// Physical KV blocks holding positions `i·block_size ..` for each logical block `i`;
    /// [`NO_BLOCK`] for the first `n_released` (released outside a sliding window).
    pub block_table: Vec<u32>,
    /// Leading entries of `block_table` released ([`Self::release_outside_window`]).
    pub n_released: usize,
    /// Leading blocks of `block_table` already offered to the prefix cache (hits, or full blocks
    /// this sequence computed).
    pub n_registered: usize,
    /// Chained hashes of the first full blocks of `tokens` (computed on demand; tokens never
    /// change, so they survive preemption).
    pub block_hashes: Vec<BlockHash>,
    /// Sampling settings and state.
    pub sampler: Sampler,
    /// Tokens sampled for this sequence so far (what `max_tokens` counts; unlike
    /// [`Sequence::n_generated`], not changed when a quarantined span is cut out).
    pub n_sampled: usize,
    /// Leading prompt tokens its caller wants kept in the prefix cache (an agent's system prompt
    /// and tools): their cached blocks are marked resident when the sequence ends
    /// ([`BlockPool::mark_resident`]). 0: none.
    pub resident_tokens: usize,
    /// Draft tokens scheduled after the pending token in the current step (speculative decoding,
    /// [`super::speculative`]); empty outside a step, or when it does not draft.
    pub draft: Vec<u32>,
    /// Its draft source (`None`: no speculation), and most draft tokens per step.
    pub drafter: Option<Drafter>,
    pub draft_k: usize,
    /// Its adaptive draft length within `draft_k` ([`DraftControl`]).
    pub draft_ctl: DraftControl,
    /// Its speculation counters.
    pub spec: SpecCounts,
    /// The conversation it belongs to (the gateway's `X-Fak-Conversation`, hashed): its output
    /// joins the conversation's draft index when it ends, and it drafts from that index.
    pub conversation: Option<u64>,
    /// A hybrid model's branch point (tokens, a block boundary): where its prompt's KV
    /// prefix-cache hit ended at its first admission, i.e. the prefix it shares with cached
    /// prompts, when its recurrent state resumed before it (no checkpoint there). Its prefill is
    /// cut there and a checkpoint taken, kept like a prompt's end: a third prompt with that
    /// prefix resumes from it. `None` before its first admission (a preempted sequence keeps
    /// its first one), `Some(0)` for none.
    pub branch_at: Option<usize>,
}

impl Sequence {
    /// A new sequence for `prompt` (not yet cached).
    pub fn new(id: u64, prompt: Vec<u32>, sampler: Sampler) -> Sequence {
        let n_prompt = prompt.len();
        Sequence {
            id,
            tokens: prompt,
            n_prompt,
            n_cached: 0,
            block_table: Vec::new(),
            n_released: 0,
            n_registered: 0,
            block_hashes: Vec::new(),
            sampler,
            n_sampled: 0,
            resident_tokens: 0,
            draft: Vec::new(),
            drafter: None,
            draft_k: 0,
            draft_ctl: DraftControl::new(1),
            spec: SpecCounts::default(),
            conversation: None,
            branch_at: None,
        }
    }

    /// Sets its speculative decoding ([`SpecParams::NONE`]: none).
    pub fn set_speculation(&mut self, p: &SpecParams) {
        self.drafter = Drafter::new(p);
        self.draft_k = if self.drafter.is_some() { p.k } else { 0 };
        self.draft_ctl = DraftControl::new(self.draft_k);
    }

    /// The draft length it would ask for now: 0 without a drafter or while its
    /// [`DraftControl`] pauses, else the adaptive length (≤ `draft_k`).
    pub fn draft_len(&self) -> usize {
        if self.drafter.is_none() {
            0
        } else {
            self.draft_ctl.len().min(self.draft_k)
        }
    }

    /// Proposes up to `k` draft tokens (at most its adaptive length, [`Self::draft_len`]) into
    /// [`Self::draft`] from its drafter; the draft stays empty without one, while paused, or when
    /// nothing matches. One call per decode step (a paused step counts towards the pause).
    pub fn propose_draft(&mut self, k: usize, conversation: Option<&ConversationIndex>) {
        self.draft.clear();
        if self.drafter.is_none() {
            return;
        }
        let k = k.min(self.draft_ctl.take()).min(self.draft_k);
        if let (Some(d), true) = (self.drafter.as_mut(), k > 0) {
            d.propose(&self.tokens, k, conversation, &mut self.draft);
        }
    }

    /// Tokens whose K/V still has to be computed.
    pub fn n_pending(&self) -> usize {
        self.tokens.len() - self.n_cached
    }

    /// Generated tokens so far.
    pub fn n_generated(&self) -> usize {
        self.tokens.len() - self.n_prompt
    }

    /// Forgets the cached K/V (after preemption, once the blocks are released): everything not
    /// found in the prefix cache is recomputed on resumption.
    pub fn reset_cache(&mut self) {
        debug_assert!(self.block_table.is_empty(), "release the blocks first");
        self.n_cached = 0;
        self.n_registered = 0;
        self.n_released = 0;
    }

    /// Under a sliding window of `window` tokens on every layer, releases the blocks no query
    /// from position `n_cached` on will read: those wholly before `n_cached + 1 − window` (the
    /// window start of the next position to compute; queries only move forward). Their entries
    /// become [`NO_BLOCK`]. Call it after [`Self::register_full_blocks`], so that a block enters the
    /// prefix cache before it is released. Returns the blocks released.
    pub fn release_outside_window(&mut self, pool: &mut BlockPool, window: usize) -> usize {
        let first_needed = (self.n_cached + 1).saturating_sub(window) / pool.block_size();
        let dead = first_needed.min(self.block_table.len());
        let mut n = 0;
        for i in self.n_released..dead {
            let b = std::mem::replace(&mut self.block_table[i], NO_BLOCK);
            if b != NO_BLOCK {
                pool.release_one(b);
                n += 1;
            }
        }
        self.n_released = self.n_released.max(dead);
        n
    }

    /// Blocks this sequence holds (its table less the released entries).
    pub fn n_held(&self) -> usize {
        self.block_table.len() - self.n_released
    }

    /// The chained hash of full block `i` (tokens `i·bs .. (i+1)·bs`, which must exist), and of
    /// its parent, hashing the blocks before it first where needed.
    pub fn block_hash(&mut self, pool: &BlockPool, i: usize) -> (BlockHash, Option<BlockHash>) {
        let bs = pool.block_size();
        while self.block_hashes.len() <= i {
            let j = self.block_hashes.len();
            let parent = j.checked_sub(1).map(|p| self.block_hashes[p]);
            let h = pool.hash_block(parent, &self.tokens[j * bs..(j + 1) * bs]);
            self.block_hashes.push(h);
        }
        (self.block_hashes[i], i.checked_sub(1).map(|p| self.block_hashes[p]))
    }

    /// The longest run of this sequence's next blocks found in the prefix cache, starting at
    /// logical block `self.block_table.len()`, without taking references. Only whole blocks
    /// strictly before the last token count (the last token is always computed, so its logits
    /// exist). Empty when the cache is off or the sequence is not block-aligned.
    ///
    /// With a sliding window of `window` tokens on every layer (`Some`), a run of `k` blocks is a
    /// hit when the blocks the next position `k·block_size` attends to are there (found, or held
    /// by the sequence): earlier blocks need not be cached (vLLM's sliding-window cache hit). Their
    /// entries are [`NO_BLOCK`]: computing from `k` never reads them. The longest such run wins.
    pub fn find_cached(&mut self, pool: &BlockPool, window: Option<usize>) -> Vec<u32> {
        let bs = pool.block_size();
        let mut hits = Vec::new();
        if !pool.prefix_caching() || self.n_cached != self.block_table.len() * bs {
            return hits;
        }
        let start = self.block_table.len();
        let max_blocks = (self.tokens.len() - 1) / bs;
        let Some(w) = window else {
            for i in start..max_blocks {
                let (h, parent) = self.block_hash(pool, i);
                match pool.lookup(h, parent, &self.tokens[i * bs..(i + 1) * bs]) {
                    Some(b) => hits.push(b),
                    None => break,
                }
            }
            return hits;
        };
        // A run of k blocks (positions < k·bs computed) is usable when the blocks position k·bs
        // attends to, first(k) = (k·bs + 1 − W)/bs .. k, are all there: from `start` on found in
        // the cache, before `start` held by the sequence (not released).
        let mut found: Vec<Option<u32>> = Vec::new();
        let mut best = start;
        let mut after_miss = start; // one past the last block not found
        for i in start..max_blocks {
            let (h, parent) = self.block_hash(pool, i);
            if pool.is_banned(h) {
                // a quarantined chain: nothing computed after this block may be taken
                break;
            }
            let b = pool.lookup(h, parent, &self.tokens[i * bs..(i + 1) * bs]);
            if b.is_none() {
                after_miss = i + 1;
            }
            found.push(b);
            let k = i + 1;
            let first = (k * bs + 1).saturating_sub(w) / bs;
            let all_found = after_miss <= first.max(start);
            let all_held = first >= start || first >= self.n_released;
            if all_found && all_held {
                best = k;
            }
        }
        let first = (best * bs + 1).saturating_sub(w) / bs;
        for (j, b) in found.into_iter().take(best - start).enumerate() {
            hits.push(if start + j < first { NO_BLOCK } else { b.expect("a needed block is found") });
        }
        hits
    }

    /// Takes a reference on each of `hits` (from [`Self::find_cached`]; [`NO_BLOCK`] entries are
    /// appended as such) and appends them to the block table: their tokens count as computed.
    /// Returns the tokens whose K/V came from the cache (the [`NO_BLOCK`] entries' tokens, before
    /// a window, are skipped, not reused: the `prefix_cache_hit_tokens` statistic). Under a
    /// window, call [`Self::release_outside_window`] next (it releases what the window has passed
    /// and keeps the released entries a prefix).
    pub fn take_cached(&mut self, pool: &mut BlockPool, hits: &[u32]) -> usize {
        for &b in hits {
            if b != NO_BLOCK {
                pool.touch(b);
            }
            self.block_table.push(b);
        }
        let bs = pool.block_size();
        self.n_cached += hits.len() * bs;
        self.n_registered = self.block_table.len();
        hits.iter().filter(|&&b| b != NO_BLOCK).count() * bs
    }

    /// The hash of the next block this sequence would compute, when that block could come from
    /// the cache instead ([`Self::find_cached`]'s conditions: block-aligned, a whole block before
    /// the last token).
    pub fn next_cacheable_block(&mut self, pool: &BlockPool) -> Option<BlockHash> {
        let bs = pool.block_size();
        let i = self.block_table.len();
        if self.n_cached != i * bs || (i + 1) * bs > self.tokens.len() - 1 {
            return None;
        }
        Some(self.block_hash(pool, i).0)
    }

    /// The hashes of the full blocks that computing the next `n` pending tokens completes.
    pub fn blocks_completed_by(&mut self, pool: &BlockPool, n: usize) -> Vec<BlockHash> {
        let bs = pool.block_size();
        let end = self.n_cached + n;
        (self.n_cached / bs..end / bs)
            .map(|i| self.block_hash(pool, i).0)
            .collect()
    }

    /// Removes tokens `start..end` from the sequence, as if it had never held them: blocks from
    /// logical block `start / block_size` on are released (those before are kept: their K/V does
    /// not depend on later tokens) and everything from that block on is pending again. The prompt
    /// shrinks by the part of the span inside it. The caller checks the range (`start < end <=
    /// tokens.len()`, something left) and has dropped the cached blocks that held the span.
    ///
    /// With blocks released outside a sliding window of `window` tokens (`Some` when the engine
    /// releases them), recomputing from block `keep` needs the blocks of position `keep·bs`'s
    /// window; when one of them is gone, everything is recomputed (from the prefix cache where
    /// it still holds the blocks).
    pub fn remove_span(&mut self, pool: &mut BlockPool, start: usize, end: usize, window: Option<usize>) {
        debug_assert!(start < end && end <= self.tokens.len() && end - start < self.tokens.len());
        let bs = pool.block_size();
        let mut keep = start / bs;
        if let Some(w) = window {
            if (keep * bs + 1).saturating_sub(w) / bs < self.n_released {
                keep = 0;
            }
        }
        pool.release_tail(&mut self.block_table, keep);
        self.n_released = self.n_released.min(keep);
        self.tokens.drain(start..end);
        self.draft.clear();
        if let Some(d) = self.drafter.as_mut() {
            d.reset(); // its index held the span
        }
        let in_prompt = end.min(self.n_prompt).saturating_sub(start);
        self.n_prompt -= in_prompt;
        self.n_cached = self.n_cached.min(keep * pool.block_size());
        self.n_registered = self.n_registered.min(keep);
        self.block_hashes.truncate(keep);
        if self.branch_at.is_some_and(|b| b > keep * bs) {
            // the tokens after `keep` changed: that point shares nothing known any more
            self.branch_at = Some(0);
        }
    }

    /// Offers every full block computed since the last call to the prefix cache.
    pub fn register_full_blocks(&mut self, pool: &mut BlockPool) {
        if !pool.prefix_caching() {
            return;
        }
        let bs = pool.block_size();
        let n_full = (self.n_cached / bs).min(self.block_table.len());
        for i in self.n_registered..n_full {
            if self.block_table[i] == NO_BLOCK {
                continue;
            }
            let (h, parent) = self.block_hash(pool, i);
            pool.register(self.block_table[i], h, parent, &self.tokens[i * bs..(i + 1) * bs]);
        }
        self.n_registered = self.n_registered.max(n_full);
    }
}
