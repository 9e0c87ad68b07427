//! Continuous-batching scheduler (Orca, Yu et al. 2022; vLLM's scheduler): which sequences run
//! in the next forward and with how many tokens.
//!
//! Every step:
//! 1. Waiting sequences are admitted in arrival order while fewer than `max_batch` run and the
//!    pool has blocks for their tokens (plus one spare block per running sequence, so that decodes
//!    rarely have to preempt).
//! 2. Running sequences with one pending token (decode) are scheduled first, one token each; then
//!    sequences with a longer pending run (prefill, or recompute after preemption) in admission
//!    order, each taking as many tokens as the per-step budget leaves (chunked prefill).
//! 3. Blocks are taken for the scheduled tokens. When the pool runs dry, the most recently admitted
//!    running sequence is preempted: its blocks are freed, its K/V forgotten, and it goes back to
//!    the front of the waiting queue with its tokens and sampler state, to be recomputed later
//!    (vLLM's recompute preemption). Nothing fails; generation just waits.
//!
//! A sequence that holds `n_ctx` tokens is not scheduled any more (its next token would not fit
//! the context); the caller stops it.
//!
//! Prefix cache (vLLM v1's automatic prefix caching): on admission a sequence looks up the full
//! blocks of its tokens in the pool's cache, in order, takes a reference on each hit and starts
//! computing at the first miss (always leaving its last token to compute). A sequence still in
//! prefill looks again whenever it stands at a block boundary, so requests that arrive together
//! with a shared prompt prefix compute it once: the first to be scheduled computes a chunk, the
//! others find it at the next step (a prefill whose next block another prefill of the same
//! forward completes is held back one step for that). After each forward, [`Scheduler::advance`] offers the blocks
//! the forward completed to the cache. Preemption and removal only drop references; cached blocks
//! outlive their sequences until the pool evicts them.
//!
//! Sliding window (`SchedulerConfig::kv_window`, set when every layer of the model is windowed):
//! after each forward (and right after prefix-cache hits are taken) a sequence releases the blocks
//! wholly before the window of its next position ([`Sequence::release_outside_window`]), so it
//! holds at most `⌈(W − 1 + C)/block_size⌉ + 1` blocks, `C` the tokens of its largest chunk
//! (`max_tokens`), however long it runs. Admission and the growth reserved for running sequences
//! count those live blocks, not the whole prompt. A prefix-cache hit then needs only the blocks the
//! window of its first computed position reads ([`Sequence::find_cached`]): the chain's earlier
//! blocks may have been evicted.

use std::collections::{HashSet, VecDeque};

use super::kv_cache::{BlockHash, BlockPool};
use super::sequence::Sequence;
use super::speculative::ConversationStore;
use crate::backend::{BatchPlan, LogitRows};

/// Limits of the scheduler.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Context window: most tokens one sequence holds.
    pub n_ctx: usize,
    /// Most sequences running at once.
    pub max_batch: usize,
    /// Most tokens in one forward (≥ `max_batch`).
    pub max_tokens: usize,
    /// Sliding window of every layer in tokens: sequences release the KV blocks outside it
    /// (see the module doc). `None`: sequences keep every block.
    pub kv_window: Option<usize>,
}

/// One sequence's share of a forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub seq_id: u64,
    /// New tokens computed for it in this forward.
    pub n_tokens: usize,
    /// Whether its last row produces logits (the chunk reaches its last token).
    pub logits: bool,
}

/// The waiting queue, the running set and the block pool.
#[derive(Debug)]
pub struct Scheduler {
    pub cfg: SchedulerConfig,
    pub pool: BlockPool,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Preemptions since creation.
    pub n_preempted: u64,
    /// Tokens looked up in the prefix cache (each admission's whole token list) and, of those,
    /// tokens found there (their prefill was skipped), since creation.
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Admissions since the last [`Scheduler::take_admitted_hits`]: `(id, hit tokens)`.
    admitted_hits: Vec<(u64, usize)>,
    /// A hybrid model's recurrent-state slots (`KvLayout::state_slots`): which sequence holds
    /// each (empty for models without recurrent layers; [`Scheduler::enable_state_slots`]).
    state_slots: Vec<Option<u64>>,
    /// A hybrid model's checkpoints of recurrent state at block boundaries, for the prefix cache.
    ckpt: Checkpoints,
    /// Speculative decoding: the most logit rows of one forward, `None` when sequences never
    /// draft ([`Scheduler::enable_speculation`]).
    spec_max_logits: Option<usize>,
    /// Most decoding sequences in a step that still draft ([`Scheduler::set_speculation_max_batch`]).
    spec_max_batch: usize,
    /// The outputs of each conversation's finished requests, indexed for drafts.
    conversations: ConversationStore,
}

/// Checkpoints of a hybrid model's recurrent state, each in a state slot after the sequences'
/// (`first + i`): the state after the block whose chained hash keys it, so that a later sequence
/// whose prefix-cache hit ends at that block resumes from it.
///
/// Eviction: a prompt's checkpoint at its end (the last block boundary before its last token,
/// where the prefill forward is cut) is what the next turn of its conversation resumes from, and
/// one at its branch point (where its KV hit ended, [`Sequence::branch_at`]: the prefix it shares
/// with another conversation) what a third conversation with that prefix resumes from; the
/// others (the ends of earlier prefill chunks, decode steps crossing a block boundary) give way
/// to those first. So a slot taken is a free one, else the least recently used of the others, else
/// the least recently used of the prompt ends. Without that order a 30k-token prompt's 60 chunk
/// checkpoints pushed every other conversation's end out (`benches/results/agent-prefix.md`,
/// 2026-12-07, hybrid section).
#[derive(Debug, Default)]
struct Checkpoints {
    first: usize,
    /// Per checkpoint slot: the block hash it holds, when it was last used, and whether it is
    /// a prompt's end.
    slots: Vec<Option<(BlockHash, u64, bool)>>,
    clock: u64,
    /// Copies the engine runs before the next forward: `(from slot, to slot)`.
    copies: Vec<(usize, usize)>,
}

impl Checkpoints {
    fn find(&mut self, h: BlockHash) -> Option<usize> {
        self.clock += 1;
        let clock = self.clock;
        let i = self.slots.iter().position(|e| e.is_some_and(|(x, _, _)| x == h))?;
        let end = self.slots[i].is_some_and(|(_, _, e)| e);
        self.slots[i] = Some((h, clock, end));
        Some(self.first + i)
    }

    /// A slot for `h` (see the eviction order above; `prompt_end`: the checkpoint is a prompt's
    /// end), or `None` when `h` has one (marked a prompt's end if `prompt_end`).
    fn take(&mut self, h: BlockHash, prompt_end: bool) -> Option<usize> {
        if let Some(e) = self.slots.iter_mut().flatten().find(|(x, _, _)| *x == h) {
            e.2 |= prompt_end;
            return None;
        }
        if self.slots.is_empty() {
            return None;
        }
        self.clock += 1;
        let lru = |slots: &[Option<(BlockHash, u64, bool)>], ends: bool| {
            (0..slots.len()).filter(|&i| slots[i].is_some_and(|(_, _, e)| e == ends)).min_by_key(|&i| slots[i].map_or(0, |(_, t, _)| t))
        };
        let i = self
            .slots
            .iter()
            .position(Option::is_none)
            .or_else(|| lru(&self.slots, false))
            .or_else(|| lru(&self.slots, true))
            .expect("non-empty");
        self.slots[i] = Some((h, self.clock, prompt_end));
        Some(self.first + i)
    }
}

/// Most admissions [`Scheduler::take_admitted_hits`] keeps between two calls (a caller that
/// never asks costs a bounded buffer).
const MAX_ADMITTED_HITS: usize = 4096;

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, pool: BlockPool) -> Scheduler {
        Scheduler {
            cfg,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            n_preempted: 0,
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
            admitted_hits: Vec::new(),
            state_slots: Vec::new(),
            ckpt: Checkpoints::default(),
            spec_max_logits: None,
            spec_max_batch: super::speculative::DEFAULT_MAX_BATCH,
            conversations: ConversationStore::default(),
        }
    }

    /// Lets decoding sequences with a drafter ([`Sequence::drafter`]) draft: each step a decoding
    /// sequence proposes up to its `draft_k` tokens, computed after its pending token with logits
    /// on every row, within the step's token budget and `max_logits` logit rows (one row is kept
    /// for every running sequence first), its context (`n_ctx`) and its `max_tokens`. Not for
    /// recurrent (hybrid) models: their state cannot be rolled back.
    pub fn enable_speculation(&mut self, max_logits: usize) {
        self.spec_max_logits = Some(max_logits);
    }

    /// The off-switch of speculation: a step with more than `n` decoding sequences schedules no
    /// drafts (their verification rows would cost more than the forwards they save);
    /// default [`super::speculative::DEFAULT_MAX_BATCH`].
    pub fn set_speculation_max_batch(&mut self, n: usize) {
        self.spec_max_batch = n;
    }

    /// After a verification step, releases the blocks of running sequence `id` past its cached
    /// positions (those that only held rejected draft tokens' K/V).
    pub fn trim_to_cached(&mut self, id: u64) {
        if let Some(s) = self.running.iter_mut().find(|s| s.id == id) {
            let keep = self.pool.blocks_for(s.n_cached);
            self.pool.release_tail(&mut s.block_table, keep);
        }
    }

    /// Keeps up to `n` checkpoints of recurrent state (state slots `first .. first + n`) for the
    /// prefix cache of a hybrid model: a sequence admitted with a cache hit resumes from the
    /// checkpoint of its hit's last block (the hit is cut back to the last block that has one).
    pub fn enable_checkpoints(&mut self, first: usize, n: usize) {
        self.ckpt = Checkpoints { first, slots: vec![None; n], ..Default::default() };
    }

    /// The state copies `(from slot, to slot)` to run before the next forward (checkpoints
    /// taken after the last forward, checkpoints restored into admitted sequences' slots).
    pub fn take_state_copies(&mut self) -> Vec<(usize, usize)> {
        std::mem::take(&mut self.ckpt.copies)
    }

    /// Gives each running sequence one of `n` recurrent-state slots (`n` ≥ `max_batch`): a hybrid
    /// model's Gated DeltaNet layers keep a sequence's state there between forwards. A sequence
    /// whose KV is recomputed (preempted, or a quarantined span cut out) starts it again from
    /// zeros at position 0.
    pub fn enable_state_slots(&mut self, n: usize) {
        self.state_slots = vec![None; n];
    }

    /// Whether sequences carry recurrent state (see [`Self::enable_state_slots`]).
    pub fn recurrent(&self) -> bool {
        !self.state_slots.is_empty()
    }

    /// The slot of sequence `id`, taken now when it has none.
    pub(crate) fn state_slot(&mut self, id: u64) -> usize {
        if let Some(i) = self.state_slots.iter().position(|&s| s == Some(id)) {
            return i;
        }
        let i = self.state_slots.iter().position(Option::is_none).expect("a free recurrent-state slot: running sequences are at most max_batch");
        self.state_slots[i] = Some(id);
        i
    }

    pub(crate) fn free_state_slot(&mut self, id: u64) {
        if let Some(i) = self.state_slots.iter().position(|&s| s == Some(id)) {
            self.state_slots[i] = None;
        }
    }

    /// Whether a sequence with this id is waiting or running.
    pub fn contains(&self, id: u64) -> bool {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .any(|s| s.id == id)
    }

    /// Queues `seq` (its prompt is checked by the caller).
    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Sets the conversation of sequence `id` ([`Sequence::conversation`]). Returns whether it
    /// exists.
    pub fn set_conversation(&mut self, id: u64, conversation: u64) -> bool {
        match self.running.iter_mut().chain(self.waiting.iter_mut()).find(|s| s.id == id) {
            Some(s) => {
                s.conversation = Some(conversation);
                true
            }
            None => false,
        }
    }

    /// Sets the resident prefix of sequence `id` ([`Sequence::resident_tokens`]). Returns whether
    /// it exists.
    pub fn set_resident(&mut self, id: u64, n_tokens: usize) -> bool {
        match self.running.iter_mut().chain(self.waiting.iter_mut()).find(|s| s.id == id) {
            Some(s) => {
                s.resident_tokens = n_tokens;
                true
            }
            None => false,
        }
    }

    /// `(sequence id, prompt tokens found in the prefix cache)` of each sequence admitted since
    /// the last call (the caller reports them per request: `cached_tokens`).
    pub fn take_admitted_hits(&mut self) -> Vec<(u64, usize)> {
        std::mem::take(&mut self.admitted_hits)
    }

    /// Drops the sequence `id` and frees its blocks (the cached blocks of its resident prefix
    /// marked resident first, [`Sequence::resident_tokens`]). Returns whether it existed.
    pub fn remove(&mut self, id: u64) -> bool {
        self.free_state_slot(id);
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut s = self.running.remove(i);
            if let (Some(c), true) = (s.conversation, s.drafter.is_some()) {
                self.conversations.add(c, &s.tokens[s.n_prompt.min(s.tokens.len())..]);
            }
            let keep = (s.resident_tokens / self.pool.block_size()).min(s.block_table.len());
            if keep > 0 {
                self.pool.mark_resident(&s.block_table[..keep]);
            }
            self.pool.release(&mut s.block_table);
            return true;
        }
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let mut s = self.waiting.remove(i).expect("index from position");
            self.pool.release(&mut s.block_table);
            return true;
        }
        false
    }

    pub fn n_running(&self) -> usize {
        self.running.len()
    }

    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The sequence `id`, running or waiting (preempted or not yet admitted).
    pub fn sequence_mut(&mut self, id: u64) -> Option<&mut Sequence> {
        self.running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
    }

    /// The running sequence `id`.
    pub fn running_mut(&mut self, id: u64) -> Option<&mut Sequence> {
        self.running.iter_mut().find(|s| s.id == id)
    }

    /// All running sequences.
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    /// Mutable access to the running sequences (to sample in parallel).
    pub fn running_all_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    /// Quarantine of a span that some sequence with this prefix saw: takes out of the prefix cache
    /// every cached block holding positions `start..` after `tokens[..start]` with the tokens of
    /// `tokens[start..]` at their start, and every block chained after those (banned, never
    /// matched again; see [`BlockPool::quarantine`]). Blocks before `start / block_size` stay.
    /// Returns how many blocks left the cache (0 with the cache off or nothing cached).
    pub fn evict_prefix(&mut self, tokens: &[u32], start: usize) -> usize {
        let bs = self.pool.block_size();
        if !self.pool.prefix_caching() || start >= tokens.len() {
            return 0;
        }
        let k = start / bs;
        let mut parent = None;
        for i in 0..k {
            parent = Some(self.pool.hash_block(parent, &tokens[i * bs..(i + 1) * bs]));
        }
        let head = &tokens[k * bs..tokens.len().min((k + 1) * bs)];
        let roots = self.pool.cached_children(parent, head);
        let mut n = self.pool.quarantine(&roots);
        // The chain of these tokens through block k is banned even where block k itself has left
        // the cache: a sliding-window hit reads no block before its window, so without this a
        // later request with the same tokens could match blocks cached after k (computed with the
        // span in their context) once k was evicted ([`Sequence::find_cached`] stops at a banned
        // hash).
        if head.len() == bs {
            n += self.pool.ban(self.pool.hash_block(parent, head));
        }
        n
    }

    /// Removes tokens `start..end` from sequence `id` (running or waiting) so that it continues
    /// exactly as a sequence that never held them: the cached blocks that held the span leave
    /// the cache ([`Self::evict_prefix`]), the sequence keeps its blocks before
    /// `start / block_size` and recomputes everything after on its next steps. Returns the blocks
    /// that left the cache, or `None` for an unknown id.
    ///
    /// Panics (caller's contract, checked by `Engine::quarantine_span`): `start < end <=
    /// tokens.len()` and at least one token left.
    pub fn quarantine_span(&mut self, id: u64, start: usize, end: usize) -> Option<usize> {
        let tokens = self
            .running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == id)?
            .tokens
            .clone();
        let n = self.evict_prefix(&tokens, start);
        let s = self
            .running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
            .expect("found above");
        s.remove_span(&mut self.pool, start, end, self.cfg.kv_window);
        if !self.state_slots.is_empty() {
            // A recurrent state has seen the span: recompute it from position 0.
            s.n_cached = 0;
        }
        Some(n)
    }

    /// Records `n_tokens` newly computed tokens of running sequence `id` (after a forward) and
    /// offers its newly full blocks to the prefix cache. Returns false for an unknown id.
    pub fn advance(&mut self, id: u64, n_tokens: usize) -> bool {
        let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
            return false;
        };
        s.n_cached += n_tokens;
        debug_assert!(s.n_cached <= s.tokens.len());
        s.register_full_blocks(&mut self.pool);
        let bs = self.pool.block_size();
        if !self.ckpt.slots.is_empty() && s.n_cached > 0 && s.n_cached % bs == 0 && self.pool.prefix_caching() {
            let h = s.block_hash(&self.pool, s.n_cached / bs - 1).0;
            let from = self.state_slots.iter().position(|&x| x == Some(id));
            // the prompt's end or its branch point: where `schedule` cut its prefill
            let prompt_end = (s.n_sampled == 0 && s.n_cached == (s.tokens.len() - 1) / bs * bs)
                || s.branch_at == Some(s.n_cached);
            if let (Some(from), Some(to)) = (from, self.ckpt.take(h, prompt_end)) {
                self.ckpt.copies.push((from, to));
            }
        }
        if let Some(w) = self.cfg.kv_window {
            s.release_outside_window(&mut self.pool, w);
        }
        true
    }

    /// The blocks running sequence `s` still has to take: for all its tokens, or with a sliding
    /// window for its next chunk (up to `max_tokens` tokens; older blocks are released as it goes).
    fn growth(&self, s: &Sequence) -> usize {
        let end = match self.cfg.kv_window {
            None => s.tokens.len(),
            Some(_) => s.tokens.len().min(s.n_cached + self.cfg.max_tokens),
        };
        self.pool.blocks_for(end).saturating_sub(s.block_table.len())
    }

    fn admit(&mut self) {
        let committed: usize = self.running.iter().map(|s| self.growth(s)).sum();
        let mut available = self.pool.n_free().saturating_sub(committed);
        let bs = self.pool.block_size();
        while self.running.len() < self.cfg.max_batch {
            let Some(front) = self.waiting.front_mut() else {
                break;
            };
            // Cache hits on blocks other sequences hold cost nothing; hits on free cached blocks
            // take them off the free list like new blocks.
            let hits = front.find_cached(&self.pool, self.cfg.kv_window);
            let shared = |hits: &[u32]| hits.iter().filter(|&&b| self.pool.ref_count(b) > 0).count();
            let need = match self.cfg.kv_window {
                None => self.pool.blocks_for(front.tokens.len()) - shared(&hits),
                Some(w) => {
                    // The hits before the window of the first position to compute are released at
                    // once; the rest, and the first chunk's blocks, are held.
                    let start = hits.len() * bs;
                    let end = front.tokens.len().min(start + self.cfg.max_tokens);
                    let first = ((start + 1).saturating_sub(w) / bs).min(hits.len());
                    self.pool.blocks_for(end) - first - shared(&hits[first..])
                }
            };
            let spare = self.running.len();
            if need + spare > available && !self.running.is_empty() {
                break;
            }
            if need > available {
                break;
            }
            available -= need;
            let mut seq = self.waiting.pop_front().expect("front exists");
            self.prefix_query_tokens += seq.tokens.len() as u64;
            let mut hits = hits;
            let kv_hit = hits.len();
            let mut restore = None;
            if self.recurrent() {
                // A hybrid resumes only where a checkpoint of its recurrent state exists: the
                // longest run of hits whose last block has one.
                while let Some(k) = hits.len().checked_sub(1) {
                    let h = seq.block_hash(&self.pool, k).0;
                    if let Some(slot) = self.ckpt.find(h) {
                        restore = Some(slot);
                        break;
                    }
                    hits.pop();
                }
            }
            if seq.branch_at.is_none() {
                seq.branch_at = Some(self.branch_point(&seq, kv_hit, hits.len()));
            }
            let hit = seq.take_cached(&mut self.pool, &hits);
            if let Some(from) = restore {
                let to = self.state_slot(seq.id);
                self.ckpt.copies.push((from, to));
            }
            self.prefix_hit_tokens += hit as u64;
            if self.admitted_hits.len() < MAX_ADMITTED_HITS {
                self.admitted_hits.push((seq.id, hit));
            }
            if let Some(w) = self.cfg.kv_window {
                seq.release_outside_window(&mut self.pool, w);
            }
            self.running.push(seq);
        }
    }

    /// A hybrid's branch point ([`Sequence::branch_at`]) for `seq`, whose KV hit of `kv_hit`
    /// blocks was cut back to `resumed` (the last with a checkpoint): the end of its KV hit when
    /// its state resumes before it and it lies before the prompt's end cut (where a checkpoint
    /// is taken anyway), else 0. Always 0 without checkpoints (dense models among them).
    fn branch_point(&self, seq: &Sequence, kv_hit: usize, resumed: usize) -> usize {
        let bs = self.pool.block_size();
        let end = (seq.tokens.len() - 1) / bs * bs;
        if self.ckpt.slots.is_empty() || kv_hit <= resumed || kv_hit * bs >= end {
            return 0;
        }
        kv_hit * bs
    }

    fn preempt_last(&mut self) -> u64 {
        let mut s = self.running.pop().expect("preempt with nothing running");
        s.draft.clear();
        self.pool.release(&mut s.block_table);
        s.reset_cache();
        let id = s.id;
        self.free_state_slot(id);
        self.waiting.push_front(s);
        self.n_preempted += 1;
        id
    }

    /// Chooses the next forward's work, takes its KV blocks and fills `plan` (cleared first) and
    /// `out` (one entry per sequence in the forward, in row order).
    pub fn schedule(&mut self, plan: &mut BatchPlan, out: &mut Vec<Scheduled>) {
        plan.clear();
        out.clear();
        self.admit();
        // Sequences in prefill at a block boundary: blocks another sequence completed since
        // their last look need not be computed again.
        if self.pool.prefix_caching() && self.state_slots.is_empty() {
            for s in &mut self.running {
                if s.n_pending() > 1 {
                    let hits = s.find_cached(&self.pool, self.cfg.kv_window);
                    self.prefix_hit_tokens += s.take_cached(&mut self.pool, &hits) as u64;
                    if let Some(w) = self.cfg.kv_window {
                        s.release_outside_window(&mut self.pool, w);
                    }
                }
            }
        }
        let n_ctx = self.cfg.n_ctx;
        let mut budget = self.cfg.max_tokens;
        let mut entries: Vec<Scheduled> = Vec::with_capacity(self.running.len());
        // Speculation: draft rows come out of what the decodes leave of the token budget and of
        // the logit rows (one kept for every running sequence).
        for s in &mut self.running {
            s.draft.clear();
        }
        let drafting = self.spec_max_logits.filter(|_| !self.recurrent());
        let (mut spare_rows, mut spare_logits) = match drafting {
            Some(max_logits) => {
                let n_dec = self.running.iter().filter(|s| s.n_pending() == 1 && s.tokens.len() < n_ctx).count();
                if n_dec > self.spec_max_batch {
                    (0, 0)
                } else {
                    (budget.saturating_sub(n_dec), max_logits.saturating_sub(self.running.len()))
                }
            }
            None => (0, 0),
        };
        // Full blocks the prefills scheduled so far complete in this forward: a sequence whose
        // next block is one of them waits a step and takes it from the cache instead.
        let caching = self.pool.prefix_caching();
        let mut in_flight: HashSet<BlockHash> = HashSet::new();
        // Decodes first, then prefills, each in admission order.
        for pass_decode in [true, false] {
            for s in &mut self.running {
                let pending = s.n_pending();
                if pending == 0
                    || (pending == 1) != pass_decode
                    || s.tokens.len() >= n_ctx
                    || budget == 0
                {
                    continue;
                }
                if caching && !pass_decode {
                    if s.next_cacheable_block(&self.pool)
                        .is_some_and(|h| in_flight.contains(&h))
                    {
                        continue;
                    }
                }
                let mut n = pending.min(budget);
                if pass_decode && s.draft_k > 0 && spare_rows > 0 && spare_logits > 0 {
                    // Room in the context and in max_tokens for every draft token and one more.
                    let left = s.sampler.params().max_tokens.map_or(usize::MAX, |m| m.saturating_sub(s.n_sampled));
                    let k = spare_rows.min(spare_logits).min(n_ctx - s.tokens.len() - 1).min(left.saturating_sub(1));
                    if k > 0 {
                        let conv = s.conversation.and_then(|c| self.conversations.get(c));
                        s.propose_draft(k, conv);
                        spare_rows -= s.draft.len();
                        spare_logits -= s.draft.len();
                        n += s.draft.len();
                    }
                }
                if !self.state_slots.is_empty() && !self.ckpt.slots.is_empty() && n > 1 {
                    // A hybrid's prefill ends one forward at its branch point (the end of the
                    // prefix it shares with cached prompts, `Sequence::branch_at`) and one at the
                    // last block boundary before its last token: checkpoints of the recurrent
                    // state are taken there.
                    let bs = self.pool.block_size();
                    let end = (s.tokens.len() - 1) / bs * bs;
                    for b in [s.branch_at.unwrap_or(0), end] {
                        if b > 0 && s.n_cached < b && s.n_cached + n > b {
                            n = b - s.n_cached;
                        }
                    }
                }
                budget -= n;
                if caching && !pass_decode {
                    in_flight.extend(s.blocks_completed_by(&self.pool, n));
                }
                entries.push(Scheduled {
                    seq_id: s.id,
                    n_tokens: n,
                    logits: n >= pending,
                });
            }
        }
        // Take blocks; preempt from the back when the pool is dry.
        let mut i = 0;
        while i < entries.len() {
            let e = entries[i];
            let Some(pos) = self.running.iter().position(|s| s.id == e.seq_id) else {
                entries.remove(i);
                continue;
            };
            let need_tokens = self.running[pos].n_cached + e.n_tokens;
            let s = &mut self.running[pos];
            if self.pool.grow(&mut s.block_table, need_tokens).is_ok() {
                i += 1;
                continue;
            }
            if !s.draft.is_empty() {
                // A draft never preempts anyone: without blocks for it, the sequence just decodes.
                s.draft.clear();
                entries[i].n_tokens = 1;
                continue;
            }
            let victim = self.preempt_last();
            if victim == e.seq_id {
                entries.remove(i);
            } else {
                // The victim's entry (if any) disappears; its blocks are free again.
                if let Some(j) = entries.iter().position(|x| x.seq_id == victim) {
                    entries.remove(j);
                    if j < i {
                        i -= 1;
                    }
                }
            }
        }
        let bs = self.pool.block_size();
        for e in &entries {
            let s = self
                .running
                .iter()
                .find(|s| s.id == e.seq_id)
                .expect("scheduled sequence is running");
            if !s.draft.is_empty() {
                // A verification: the pending token and the draft, logits on every row.
                debug_assert_eq!(e.n_tokens, 1 + s.draft.len());
                let mut toks = Vec::with_capacity(e.n_tokens);
                toks.push(s.tokens[s.n_cached]);
                toks.extend_from_slice(&s.draft);
                plan.push_seq(&toks, s.n_cached, &s.block_table, bs, LogitRows::All);
                plan.set_prompt_len(s.n_prompt);
                continue;
            }
            let toks = &s.tokens[s.n_cached..s.n_cached + e.n_tokens];
            plan.push_seq(
                toks,
                s.n_cached,
                &s.block_table,
                bs,
                if e.logits {
                    LogitRows::Last
                } else {
                    LogitRows::None
                },
            );
            plan.set_prompt_len(s.n_prompt);
        }
        if self.recurrent() {
            for (i, e) in entries.iter().enumerate() {
                let slot = self.state_slot(e.seq_id);
                plan.seqs[i].state_slot = slot as u32;
            }
        }
        *out = entries;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::{Sampler, SamplingParams};

    #[test]
    fn checkpoints_evict_other_checkpoints_before_prompt_ends() {
        let mut c = Checkpoints { first: 10, slots: vec![None; 3], ..Default::default() };
        assert_eq!(c.take(1, true), Some(10)); // conversation A's prompt end
        assert_eq!(c.take(2, false), Some(11)); // chunk ends of B's long prompt
        assert_eq!(c.take(3, false), Some(12));
        assert_eq!(c.take(4, false), Some(11), "a chunk end takes the oldest chunk end's slot, not A's end");
        assert_eq!(c.take(5, true), Some(12), "B's prompt end takes a chunk end's slot");
        assert_eq!(c.find(1), Some(10), "A's end outlived B's chunks");
        assert_eq!(c.take(6, true), Some(11));
        assert_eq!(c.take(7, true), Some(12), "with only prompt ends left, the least recently used goes");
        assert_eq!(c.find(5), None);
        assert_eq!(c.take(1, false), None, "a block already checkpointed takes no slot");
        assert_eq!(c.take(8, false), Some(10), "still all prompt ends: the least recently used (A's) goes");
        assert_eq!(c.take(9, false), Some(10), "then the chunk end, before the prompt ends");
    }

    fn seq(id: u64, n: usize) -> Sequence {
        seq_of(id, (0..n as u32).collect())
    }

    fn seq_of(id: u64, tokens: Vec<u32>) -> Sequence {
        Sequence::new(
            id,
            tokens,
            Sampler::new(SamplingParams {
                seed: Some(1),
                ..Default::default()
            })
            .unwrap(),
        )
    }

    /// Marks the scheduled work done and appends a token to sequences that got logits.
    fn complete(s: &mut Scheduler, out: &[Scheduled]) {
        for e in out {
            assert!(s.advance(e.seq_id, e.n_tokens));
            if e.logits {
                s.running_mut(e.seq_id).unwrap().tokens.push(7);
            }
        }
    }

    #[test]
    fn decodes_first_then_chunked_prefill() {
        let cfg = SchedulerConfig {
            n_ctx: 256,
            max_batch: 4,
            max_tokens: 16,
            kv_window: None,
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(64, 8, false));
        s.add(seq(1, 5));
        let (mut plan, mut out) = (BatchPlan::default(), Vec::new());
        s.schedule(&mut plan, &mut out);
        assert_eq!(
            out,
            vec![Scheduled {
                seq_id: 1,
                n_tokens: 5,
                logits: true
            }]
        );
        assert_eq!(plan.positions, vec![0, 1, 2, 3, 4]);
        assert_eq!(plan.logit_rows, vec![4]);
        complete(&mut s, &out);
        // A long prompt arrives: the decode of 1 goes first, the prompt is chunked by the budget.
        s.add(seq(2, 40));
        s.schedule(&mut plan, &mut out);
        assert_eq!(
            out,
            vec![
                Scheduled {
                    seq_id: 1,
                    n_tokens: 1,
                    logits: true
                },
                Scheduled {
                    seq_id: 2,
                    n_tokens: 15,
                    logits: false
                }
            ]
        );
        assert_eq!(plan.seqs[0].n_past, 5);
        assert_eq!(plan.seqs[1].row0, 1);
        assert_eq!(plan.logit_rows, vec![0]);
        complete(&mut s, &out);
        s.schedule(&mut plan, &mut out);
        assert_eq!(
            out[1],
            Scheduled {
                seq_id: 2,
                n_tokens: 15,
                logits: false
            }
        );
        complete(&mut s, &out);
        s.schedule(&mut plan, &mut out);
        assert_eq!(
            out[1],
            Scheduled {
                seq_id: 2,
                n_tokens: 10,
                logits: true
            }
        );
        assert_eq!(plan.positions[1], 30);
        // Slots follow the block table.
        let s2 = s.running().iter().find(|q| q.id == 2).unwrap();
        assert_eq!(plan.slots[1], s2.block_table[30 / 8] * 8 + 30 % 8);
    }

    #[test]
    fn max_batch_and_context_limit() {
        let cfg = SchedulerConfig {
            n_ctx: 8,
            max_batch: 2,
            max_tokens: 64,
            kv_window: None,
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(64, 4, false));
        for i in 0..3 {
            s.add(seq(i, 6));
        }
        let (mut plan, mut out) = (BatchPlan::default(), Vec::new());
        s.schedule(&mut plan, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!((s.n_running(), s.n_waiting()), (2, 1));
        complete(&mut s, &out);
        s.schedule(&mut plan, &mut out); // tokens 7 → 8 = n_ctx
        complete(&mut s, &out);
        s.schedule(&mut plan, &mut out);
        assert!(
            out.is_empty(),
            "sequences at n_ctx are not scheduled: {out:?}"
        );
        assert!(s.remove(0));
        assert!(!s.remove(0));
        s.schedule(&mut plan, &mut out);
        assert_eq!(
            out,
            vec![Scheduled {
                seq_id: 2,
                n_tokens: 6,
                logits: true
            }]
        );
    }

    #[test]
    fn admission_waits_for_blocks() {
        let cfg = SchedulerConfig {
            n_ctx: 16,
            max_batch: 4,
            max_tokens: 64,
            kv_window: None,
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(4, 4, false));
        let (mut plan, mut out) = plan_out();
        s.add(seq(1, 8));
        s.add(seq(2, 8));
        s.schedule(&mut plan, &mut out);
        // Sequence 1 takes 2 blocks; sequence 2 needs 2 plus a spare for 1's growth: it waits.
        assert_eq!(
            out,
            vec![Scheduled {
                seq_id: 1,
                n_tokens: 8,
                logits: true
            }]
        );
        assert_eq!((s.n_running(), s.n_waiting(), s.pool.n_free()), (1, 1, 2));
        complete(&mut s, &out);
        assert!(s.remove(1));
        assert_eq!(s.pool.n_free(), 4);
        s.schedule(&mut plan, &mut out);
        assert_eq!(
            out,
            vec![Scheduled {
                seq_id: 2,
                n_tokens: 8,
                logits: true
            }]
        );
    }

    #[test]
    fn preemption_recomputes_later() {
        let cfg = SchedulerConfig {
            n_ctx: 32,
            max_batch: 4,
            max_tokens: 64,
            kv_window: None,
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(4, 4, false));
        let (mut plan, mut out) = plan_out();
        // Two sequences admitted together (3 tokens each → 1 block each, spare ok).
        s.add(seq(1, 3));
        s.add(seq(2, 3));
        s.schedule(&mut plan, &mut out);
        assert_eq!(out.len(), 2);
        complete(&mut s, &out);
        // Decode until the pool is exhausted; a preemption must happen, then sequence 2 returns.
        let mut seen_preempt = false;
        for _ in 0..12 {
            s.schedule(&mut plan, &mut out);
            // Invariant: every scheduled row has a slot inside its sequence's blocks.
            for (r, &slot) in plan.slots.iter().enumerate() {
                assert!((slot as usize) < 16, "row {r} slot {slot}");
            }
            complete(&mut s, &out);
            if s.n_preempted > 0 {
                seen_preempt = true;
            }
            if seen_preempt && s.n_waiting() == 0 {
                break;
            }
        }
        assert!(seen_preempt);
        assert!(s.pool.n_used() <= 4);
        // A preempted sequence resumes with its whole history pending (recompute).
        s.remove(1);
        s.schedule(&mut plan, &mut out);
        let e = out.iter().find(|e| e.seq_id == 2).unwrap();
        assert!(e.logits);
    }

    fn plan_out() -> (BatchPlan, Vec<Scheduled>) {
        (BatchPlan::default(), Vec::new())
    }

    /// The pool's invariants, with the reference counts the sequences' block tables imply.
    fn check_pool(s: &Scheduler) {
        let mut held = vec![0u32; s.pool.n_total()];
        for q in s.running.iter().chain(s.waiting.iter()) {
            for &b in q.block_table.iter().filter(|&&b| b != crate::backend::NO_BLOCK) {
                held[b as usize] += 1;
            }
        }
        s.pool.check(&held).unwrap();
    }

    fn windowed_scheduler(n_blocks: usize, max_tokens: usize, window: usize, caching: bool) -> Scheduler {
        let cfg = SchedulerConfig {
            n_ctx: 100_000,
            max_batch: 8,
            max_tokens,
            kv_window: Some(window),
        };
        Scheduler::new(cfg, BlockPool::new(n_blocks, 4, caching))
    }

    /// Every scheduled sequence's table holds live blocks exactly from the block of its first
    /// row's window start on, and `NO_BLOCK` before it.
    fn check_window_tables(s: &Scheduler, plan: &BatchPlan, window: usize) {
        let bs = s.pool.block_size();
        for q in &plan.seqs {
            let t = &plan.block_tables[q.table0 as usize..(q.table0 + q.n_blocks) as usize];
            let first = (q.n_past as usize + 1).saturating_sub(window) / bs;
            for (i, &b) in t.iter().enumerate() {
                assert_eq!(b == crate::backend::NO_BLOCK, i < first, "block {i} of {t:?}, window from block {first}");
            }
        }
    }

    #[test]
    fn windowed_stream_holds_bounded_blocks() {
        // W = 8, blocks of 4, chunks of 4: at most ⌈(8 − 1 + 4)/4⌉ + 1 = 4 blocks held, in a pool
        // of 5 — for a prompt of 100 tokens and 60 generated ones (40 blocks' worth).
        for caching in [false, true] {
            let mut s = windowed_scheduler(5, 4, 8, caching);
            s.add(seq_of(1, (0..100).map(|t| t % 13).collect()));
            let mut peak = 0;
            let mut generated = 0;
            for _ in 0..200 {
                let (mut plan, mut out) = plan_out();
                s.schedule(&mut plan, &mut out);
                assert_eq!(out.len(), 1, "the stream always runs");
                check_private_writes(&s, &plan);
                check_window_tables(&s, &plan, 8);
                peak = peak.max(s.pool.n_used());
                if out[0].logits {
                    generated += 1;
                }
                complete(&mut s, &out);
                check_pool(&s);
                if generated == 60 {
                    break;
                }
            }
            assert_eq!(generated, 60);
            assert!(peak <= 4, "peak {peak} blocks");
            assert_eq!(s.n_preempted, 0);
            let q = &s.running()[0];
            assert_eq!(q.n_cached, 159);
            assert_eq!(q.n_released, 38, "blocks wholly before position 152");
            assert_eq!(q.n_held(), q.block_table.len() - 38);
            s.remove(1);
            check_pool(&s);
            assert_eq!(s.pool.n_free(), 5);
        }
    }

    #[test]
    fn windowed_prefix_hits_release_what_the_window_passed() {
        // A pool large enough to keep the first stream's released blocks cached: a second
        // sequence with the same 40-token prefix takes its 10 full blocks from the cache and keeps
        // only those its window still needs.
        let mut s = windowed_scheduler(32, 8, 6, true);
        let prompt: Vec<u32> = (0..40).collect();
        stream_into_cache(&mut s, 1, &prompt);
        assert_eq!(s.pool.n_used(), 0);
        let mut longer = prompt.clone();
        longer.extend([50, 51, 52]);
        s.add(seq_of(2, longer));
        let (mut plan, mut out) = plan_out();
        s.schedule(&mut plan, &mut out);
        // 40 tokens skipped, of which the 8 of blocks 8 and 9 came from the cache (the window
        // of position 40 reads them); blocks 0..8 are not needed (NO_BLOCK) and not counted.
        assert_eq!(s.prefix_hit_tokens, 8);
        assert_eq!(out, vec![Scheduled { seq_id: 2, n_tokens: 3, logits: true }]);
        check_window_tables(&s, &plan, 6);
        let q = &s.running()[0];
        // First position computed: 40, window from 35: blocks 0..8 released, 8 and 9 held + block
        // 10 for positions 40..42.
        assert_eq!((q.n_released, q.n_held()), (8, 3));
        check_pool(&s);
        complete(&mut s, &out);
        check_pool(&s);
    }

    #[test]
    fn quarantine_holds_after_its_first_block_left_the_cache() {
        // A windowed stream's early blocks are recycled (block 5 among them) while blocks 6.. stay
        // cached; quarantining a span in block 5 must still keep a request with the same tokens
        // from taking blocks 6.. (computed with the span in their context), though its window
        // needs no block before it.
        let mut s = windowed_scheduler(14, 8, 6, true);
        let prompt: Vec<u32> = (0..80).collect();
        stream_into_cache(&mut s, 1, &prompt);
        let chain = |s: &Scheduler, n: usize| {
            let mut parent = None;
            (0..n)
                .map(|i| {
                    let h = s.pool.hash_block(parent, &prompt[i * 4..(i + 1) * 4]);
                    let found = s.pool.lookup(h, parent, &prompt[i * 4..(i + 1) * 4]).is_some();
                    parent = Some(h);
                    found
                })
                .collect::<Vec<bool>>()
        };
        let cached = chain(&s, 20);
        assert!(!cached[5] && cached[6..].iter().all(|&c| c), "block 5 recycled, 6.. cached: {cached:?}");
        let dropped = s.evict_prefix(&prompt, 5 * 4 + 3);
        assert!(dropped >= 14, "the cached blocks chained after block 5 left the cache ({dropped})");
        assert!(chain(&s, 20)[5..].iter().all(|&c| !c));
        let mut q = seq_of(2, prompt.clone());
        let hits = q.find_cached(&s.pool, Some(6));
        assert!(hits.len() <= 5, "no hit may reach past the quarantined block 5: {hits:?}");
        check_pool(&s);
    }

    #[test]
    fn windowed_hit_skips_evicted_early_blocks() {
        // A pool of 8 blocks recycles a 40-token stream's first blocks; a second sequence with
        // the same first 38 tokens still takes 9 blocks' worth from the cache: those its window
        // needs (7 and 8) are there, the others are not needed (NO_BLOCK, never read).
        let mut s = windowed_scheduler(8, 8, 6, true);
        let prompt: Vec<u32> = (0..40).collect();
        stream_into_cache(&mut s, 1, &prompt);
        let h0 = s.pool.hash_block(None, &prompt[0..4]);
        assert!(s.pool.lookup(h0, None, &prompt[0..4]).is_none(), "block 0 was evicted");
        let mut p2 = prompt[..38].to_vec();
        p2.extend([99, 98]);
        s.add(seq_of(2, p2));
        let (mut plan, mut out) = plan_out();
        s.schedule(&mut plan, &mut out);
        check_private_writes(&s, &plan);
        check_window_tables(&s, &plan, 6);
        check_pool(&s);
        // 36 tokens skipped; blocks 7 and 8 (8 tokens) came from the cache
        assert_eq!(s.prefix_hit_tokens, 8);
        assert_eq!(out, vec![Scheduled { seq_id: 2, n_tokens: 4, logits: true }]);
        let q = &s.running()[0];
        assert_eq!((q.n_cached, q.n_released, q.n_held()), (36, 7, 3));
        complete(&mut s, &out);
        check_pool(&s);
        // Without a window the same lookup finds nothing (the chain from block 0 is gone).
        let mut q = seq_of(3, prompt[..38].to_vec());
        assert!(q.find_cached(&s.pool, None).is_empty());
        assert_eq!(q.find_cached(&s.pool, Some(6)).len(), 9);
    }

    #[test]
    fn windowed_quarantine_recomputes_when_the_window_is_gone() {
        let mut s = windowed_scheduler(16, 16, 6, false);
        s.add(seq_of(1, (0..60).collect()));
        step(&mut s);
        step(&mut s);
        assert_eq!(s.running()[0].n_released, 6, "positions 0..24 (blocks 0-5) released");
        // A span ahead of what is computed: recomputing from block 10 needs positions 35.., held.
        s.quarantine_span(1, 40, 45).unwrap();
        check_pool(&s);
        let q = &s.running()[0];
        assert_eq!((q.n_cached, q.n_released, q.block_table.len(), q.tokens.len()), (32, 6, 8, 55));
        // A span at 26: recomputing from block 6 (position 24) needs positions 19.., released:
        // everything is recomputed.
        s.quarantine_span(1, 26, 28).unwrap();
        check_pool(&s);
        let q = &s.running()[0];
        assert_eq!((q.n_cached, q.n_released, q.block_table.len()), (0, 0, 0));
        let out = step(&mut s);
        assert_eq!(out[0].n_tokens, 16);
        assert_eq!(s.running()[0].n_released, 2);
    }

    /// Every row the plan writes lands in a block its sequence holds alone and that is not in the
    /// prefix cache (sharing is read-only).
    fn check_private_writes(s: &Scheduler, plan: &BatchPlan) {
        let bs = s.pool.block_size() as u32;
        for &slot in &plan.slots {
            let b = slot / bs;
            assert_eq!(s.pool.ref_count(b), 1, "write into shared block {b}");
            assert!(!s.pool.is_cached(b), "write into cached block {b}");
        }
    }

    fn cached_scheduler(n_blocks: usize, max_tokens: usize) -> Scheduler {
        let cfg = SchedulerConfig {
            n_ctx: 256,
            max_batch: 8,
            max_tokens,
            kv_window: None,
        };
        Scheduler::new(cfg, BlockPool::new(n_blocks, 4, true))
    }

    /// Runs sequence `id` over `prompt` until every token is computed, then removes it (its full
    /// blocks stay cached as far as the pool keeps them); checks the pool.
    fn stream_into_cache(s: &mut Scheduler, id: u64, prompt: &[u32]) {
        s.add(seq_of(id, prompt.to_vec()));
        while s.running().first().is_none_or(|q| q.n_cached < prompt.len()) {
            step(s);
        }
        s.remove(id);
        check_pool(s);
    }

    /// Schedules one step, checks the invariants, completes it; returns the entries.
    fn step(s: &mut Scheduler) -> Vec<Scheduled> {
        let (mut plan, mut out) = plan_out();
        s.schedule(&mut plan, &mut out);
        check_private_writes(s, &plan);
        complete(s, &out);
        check_pool(s);
        out
    }

    #[test]
    fn prefix_hits_skip_full_blocks() {
        let mut s = cached_scheduler(16, 64);
        let prompt: Vec<u32> = (100..110).collect();
        s.add(seq_of(1, prompt.clone()));
        assert_eq!(step(&mut s)[0].n_tokens, 10);
        assert_eq!(s.pool.n_cached(), 2, "the two full blocks of 10 tokens are cached");
        let first: Vec<u32> = s.running()[0].block_table[..2].to_vec();
        assert!(s.remove(1));
        check_pool(&s);
        assert_eq!(s.pool.n_free(), 16);
        // The conversation grows: the same 10 tokens, one generated token, 4 new ones.
        let mut longer = prompt.clone();
        longer.extend([7, 1, 2, 3, 4]);
        s.add(seq_of(2, longer.clone()));
        let (mut plan, mut out) = plan_out();
        s.schedule(&mut plan, &mut out);
        check_private_writes(&s, &plan);
        assert_eq!(out, vec![Scheduled { seq_id: 2, n_tokens: 7, logits: true }]);
        assert_eq!(plan.positions, (8..15).collect::<Vec<u32>>());
        assert_eq!(plan.tokens, longer[8..].to_vec());
        let q = &s.running()[0];
        assert_eq!(q.block_table[..2], first[..], "the cached blocks themselves");
        assert_eq!(&plan.block_tables[..2], &first[..]);
        assert_eq!((s.prefix_query_tokens, s.prefix_hit_tokens), (10 + 15, 8));
        complete(&mut s, &out);
        check_pool(&s);
        // A different first block: nothing is found even though later blocks match.
        let mut other = longer.clone();
        other[0] = 5;
        s.add(seq_of(3, other));
        let out = step(&mut s);
        assert_eq!(out.iter().find(|e| e.seq_id == 3).unwrap().n_tokens, 15);
        assert_eq!(s.prefix_hit_tokens, 8);
    }

    #[test]
    fn the_last_token_is_always_computed() {
        let mut s = cached_scheduler(16, 64);
        let prompt: Vec<u32> = (0..8).collect();
        s.add(seq_of(1, prompt.clone()));
        step(&mut s);
        s.remove(1);
        // Both blocks of the identical prompt are cached; the second holds the last token, so
        // only the first is taken and 4 tokens are computed (into a new, private block).
        s.add(seq_of(2, prompt.clone()));
        let out = step(&mut s);
        assert_eq!(out, vec![Scheduled { seq_id: 2, n_tokens: 4, logits: true }]);
        assert_eq!(s.prefix_hit_tokens, 4);
        // One token longer: both blocks hit, one token computed.
        let mut nine = prompt;
        nine.push(9);
        s.add(seq_of(3, nine));
        let out = step(&mut s);
        assert_eq!(out.iter().find(|e| e.seq_id == 3).unwrap().n_tokens, 1);
        assert_eq!(s.prefix_hit_tokens, 4 + 8);
    }

    #[test]
    fn concurrent_sequences_compute_a_shared_prefix_once() {
        // A budget of 8 tokens per step: the second sequence waits for the first one's chunks
        // and takes them from the cache.
        let mut s = cached_scheduler(32, 8);
        let prompt: Vec<u32> = (50..70).collect();
        s.add(seq_of(1, prompt.clone()));
        s.add(seq_of(2, prompt.clone()));
        s.add(seq_of(3, prompt.clone()));
        let mut computed = std::collections::HashMap::new();
        for _ in 0..8 {
            for e in step(&mut s) {
                *computed.entry(e.seq_id).or_insert(0) += e.n_tokens;
            }
        }
        assert_eq!(computed[&1], 20 + 5, "prompt in three steps, then a decode per step");
        // The others computed only what was not cached yet when they were scheduled.
        assert!(computed[&2] < 20 && computed[&3] < 20, "{computed:?}");
        assert_eq!(s.prefix_hit_tokens, 16 + 16, "four full blocks (the fifth holds the last token) each");
        for q in s.running() {
            assert_eq!(q.block_table[..4], s.running()[0].block_table[..4], "shared blocks");
        }
        for b in &s.running()[0].block_table[..4] {
            assert_eq!(s.pool.ref_count(*b), 3);
        }
        for id in 1..=3 {
            s.remove(id);
            check_pool(&s);
        }
        assert_eq!(s.pool.n_free(), 32);
    }

    #[test]
    fn a_block_computed_in_this_step_is_not_computed_twice() {
        let mut s = cached_scheduler(32, 64);
        let prompt: Vec<u32> = (0..20).collect();
        s.add(seq_of(1, prompt.clone()));
        s.add(seq_of(2, prompt.clone()));
        let mut other = prompt.clone();
        other[0] = 99;
        s.add(seq_of(3, other));
        // 1 computes the prompt; 2 would compute the same blocks and waits; 3 differs and runs.
        let out = step(&mut s);
        assert_eq!(
            out.iter().map(|e| (e.seq_id, e.n_tokens)).collect::<Vec<_>>(),
            vec![(1, 20), (3, 20)]
        );
        let out = step(&mut s);
        assert_eq!(out.iter().find(|e| e.seq_id == 2).unwrap().n_tokens, 4);
        assert_eq!(s.prefix_hit_tokens, 16);
        // With the cache off nothing waits.
        let mut s = Scheduler::new(s.cfg, BlockPool::new(32, 4, false));
        s.add(seq_of(1, prompt.clone()));
        s.add(seq_of(2, prompt));
        assert_eq!(step(&mut s).len(), 2);
    }

    #[test]
    fn preemption_keeps_refcounts_and_finds_its_own_blocks() {
        let mut s = cached_scheduler(16, 64);
        s.add(seq_of(1, (0..9).collect()));
        s.add(seq_of(2, (0..9).collect()));
        step(&mut s); // 1 computes the prompt, 2 waits for its blocks
        step(&mut s); // 2 takes them: 8 hits, 1 token computed
        assert_eq!(s.prefix_hit_tokens, 8);
        assert_eq!(s.pool.n_cached(), 2);
        let shared = s.running()[0].block_table[..2].to_vec();
        assert_eq!(s.running()[1].block_table[..2], shared[..]);
        assert_eq!(s.pool.ref_count(shared[0]), 2);
        let victim = s.preempt_last();
        assert_eq!(victim, 2);
        check_pool(&s);
        assert_eq!(s.pool.ref_count(shared[0]), 1);
        assert_eq!((s.n_running(), s.n_waiting()), (1, 1));
        // Re-admitted, 2 finds the shared blocks again and recomputes the rest.
        let out = step(&mut s);
        let e = out.iter().find(|e| e.seq_id == 2).unwrap();
        assert_eq!(e.n_tokens, 10 - 8, "9 prompt tokens + 1 generated, 8 from the cache");
        assert_eq!(s.prefix_hit_tokens, 16);
        assert_eq!(s.prefix_query_tokens, 9 + 9 + 10);
        // Preempt 2 again and remove 1: the shared blocks go back to one holder, then none.
        assert_eq!(s.preempt_last(), 2);
        check_pool(&s);
        s.remove(1);
        check_pool(&s);
        assert_eq!(s.pool.n_used(), 0);
        assert!(s.pool.n_cached() >= 2, "cached blocks outlive their sequences");
        // Removing a waiting (preempted) sequence is a no-op for the pool.
        assert!(s.remove(2));
        check_pool(&s);
        assert_eq!(s.pool.n_free(), 16);
    }

    #[test]
    fn cancel_mid_prefill_keeps_completed_blocks() {
        let mut s = cached_scheduler(16, 8);
        let prompt: Vec<u32> = (30..50).collect();
        s.add(seq_of(1, prompt.clone()));
        let out = step(&mut s);
        assert_eq!(out, vec![Scheduled { seq_id: 1, n_tokens: 8, logits: false }]);
        assert!(s.remove(1));
        check_pool(&s);
        assert_eq!((s.pool.n_free(), s.pool.n_cached()), (16, 2));
        s.add(seq_of(2, prompt));
        let out = step(&mut s);
        assert_eq!(out, vec![Scheduled { seq_id: 2, n_tokens: 8, logits: false }]);
        assert_eq!(s.running()[0].n_cached, 16, "8 from the cache, 8 computed");
    }

    #[test]
    fn eviction_under_pressure() {
        let mut s = cached_scheduler(4, 64);
        s.add(seq_of(1, (0..9).collect()));
        step(&mut s);
        s.remove(1);
        assert_eq!(s.pool.n_cached(), 2);
        // An unrelated prompt needs the whole pool: the cached blocks are evicted.
        s.add(seq_of(2, (100..115).collect()));
        step(&mut s);
        assert_eq!(s.pool.n_free(), 0);
        assert_eq!(s.pool.n_cached(), 3);
        s.remove(2);
        s.add(seq_of(3, (0..9).collect()));
        let out = step(&mut s);
        assert_eq!(out[0].n_tokens, 9, "evicted: recomputed");
        assert_eq!(s.prefix_hit_tokens, 0);
    }

    #[test]
    fn admission_counts_shared_hits_as_free() {
        // 5 blocks of 4. Sequence 1 holds 3 blocks (2 full, cached). Sequence 2 has the same
        // first 8 tokens and 3 more: it needs 3 blocks, 2 of them shared, so 1 new block (plus
        // the spare block kept per running sequence) fits in the 2 free ones.
        let cfg = SchedulerConfig { n_ctx: 64, max_batch: 4, max_tokens: 64, kv_window: None };
        let mut s = Scheduler::new(cfg, BlockPool::new(5, 4, true));
        s.add(seq_of(1, (0..9).collect()));
        step(&mut s);
        let mut p2: Vec<u32> = (0..8).collect();
        p2.extend([60, 61, 62]);
        s.add(seq_of(2, p2));
        let out = step(&mut s);
        assert_eq!(s.n_running(), 2, "admitted thanks to the shared blocks");
        assert_eq!(out.iter().find(|e| e.seq_id == 2).unwrap().n_tokens, 3);
    }

    #[test]
    fn quarantine_span_keeps_the_head_and_recomputes_the_rest() {
        let mut s = cached_scheduler(32, 64);
        let prompt: Vec<u32> = (0..22).collect(); // blocks [0..4) [4..8) ... [20..22)
        s.add(seq_of(1, prompt.clone()));
        step(&mut s);
        step(&mut s); // one decode: 23 tokens, 22 cached
        let head = s.running()[0].block_table[..2].to_vec();
        assert_eq!(s.pool.n_cached(), 5);
        // Remove positions 9..14 (blocks 2 and 3 hold them): blocks 0-1 stay, 2.. recomputed.
        let dropped = s.quarantine_span(1, 9, 14).unwrap();
        assert_eq!(dropped, 3, "cached blocks 2, 3, 4 held or followed the span");
        check_pool(&s);
        let q = &s.running()[0];
        assert_eq!(q.block_table, head);
        assert_eq!((q.n_cached, q.n_prompt, q.tokens.len()), (8, 17, 19));
        let mut clean: Vec<u32> = (0..9).chain(14..22).collect();
        clean.extend([7, 7]);
        assert_eq!(q.tokens, clean);
        assert_eq!(s.pool.n_cached(), 2);
        let (mut plan, mut out) = plan_out();
        s.schedule(&mut plan, &mut out);
        assert_eq!(out, vec![Scheduled { seq_id: 1, n_tokens: 11, logits: true }]);
        assert_eq!(plan.positions, (8..19).collect::<Vec<u32>>());
        complete(&mut s, &out);
        check_pool(&s);
        // A new sequence with the poisoned prompt finds only the clean head in the cache.
        s.add(seq_of(2, prompt.clone()));
        let out = step(&mut s);
        assert_eq!(out.iter().find(|e| e.seq_id == 2).unwrap().n_tokens, 22 - 8);
        // and its blocks holding the span are never cached again
        let cached: Vec<Vec<u32>> = s.pool.cached_blocks().into_iter().map(|(_, _, t)| t).collect();
        assert!(!cached.iter().any(|t| t.contains(&10)), "{cached:?}");
        assert!(s.quarantine_span(99, 0, 1).is_none());
    }

    #[test]
    fn random_workload_keeps_the_pool_consistent() {
        // Many sequences over a small alphabet (lots of sharing), a small pool (preemption and
        // eviction), random removals: the invariants hold after every step.
        let mut s = cached_scheduler(24, 16);
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut ids = Vec::new();
        for id in 0..200u64 {
            if next(3) == 0 && s.contains(id.saturating_sub(1)) {
                s.remove(id - 1);
                check_pool(&s);
            }
            let len = 1 + next(30) as usize;
            let prefix = next(3) as u32;
            let toks: Vec<u32> = (0..len).map(|i| if i < 12 { prefix * 1000 + i as u32 } else { next(4) as u32 }).collect();
            s.add(seq_of(id, toks));
            ids.push(id);
            step(&mut s);
            // Stop sequences that grew long.
            let long: Vec<u64> = s.running().iter().filter(|q| q.tokens.len() > 40).map(|q| q.id).collect();
            for id in long {
                s.remove(id);
                check_pool(&s);
            }
        }
        assert!(s.prefix_hit_tokens > 0 && s.n_preempted > 0, "{} hits, {} preemptions", s.prefix_hit_tokens, s.n_preempted);
        for id in ids {
            s.remove(id);
        }
        check_pool(&s);
        assert_eq!(s.pool.n_free(), 24);
    }

    #[test]
    fn windowed_random_workload_keeps_the_pool_consistent() {
        // The same churn under a window of 6 in a pool of 8 blocks (blocks released as sequences
        // advance, hits that skip blocks, preemption, quarantine of random spans): the pool's invariants, private
        // writes and the window tables hold after every step, and every sequence holds at most
        // its live blocks.
        let mut s = windowed_scheduler(8, 8, 6, true);
        let mut rng = 0x2545f4914f6cdd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let bound = (6 - 1 + 8usize).div_ceil(4) + 1;
        let mut ids = Vec::new();
        for id in 0..300u64 {
            if next(3) == 0 && s.contains(id.saturating_sub(1)) {
                s.remove(id - 1);
                check_pool(&s);
            }
            if next(5) == 0 {
                if let Some(q) = s.running().first() {
                    let (qid, n) = (q.id, q.tokens.len());
                    if n > 2 {
                        let start = next(n as u64 - 1) as usize;
                        s.quarantine_span(qid, start, start + 1).unwrap();
                        check_pool(&s);
                    }
                }
            }
            let len = 1 + next(40) as usize;
            let prefix = next(3) as u32;
            let toks: Vec<u32> = (0..len).map(|i| if i < 20 { prefix * 1000 + i as u32 } else { next(4) as u32 }).collect();
            s.add(seq_of(id, toks));
            ids.push(id);
            let (mut plan, mut out) = plan_out();
            s.schedule(&mut plan, &mut out);
            check_private_writes(&s, &plan);
            check_window_tables(&s, &plan, 6);
            for q in s.running() {
                assert!(q.n_held() <= bound, "sequence {} holds {} blocks", q.id, q.n_held());
            }
            complete(&mut s, &out);
            check_pool(&s);
            let long: Vec<u64> = s.running().iter().filter(|q| q.tokens.len() > 60).map(|q| q.id).collect();
            for id in long {
                s.remove(id);
                check_pool(&s);
            }
        }
        assert!(s.prefix_hit_tokens > 0 && s.n_preempted > 0, "{} hits, {} preemptions", s.prefix_hit_tokens, s.n_preempted);
        for id in ids {
            s.remove(id);
        }
        check_pool(&s);
        assert_eq!(s.pool.n_free(), 8);
    }

    /// Speculation: a decoding sequence with a drafter is scheduled as `1 + draft` rows, every
    /// one with logits, within the budgets; after a partial acceptance its blocks past the
    /// accepted positions go back to the pool, and a full pool drops the draft, never preempts.
    #[test]
    fn drafts_are_verified_rows_and_roll_back() {
        use crate::engine::speculative::{SpecMethod, SpecParams};
        let mut s = cached_scheduler(12, 16);
        s.enable_speculation(64);
        // a periodic prompt: the n-gram index proposes its continuation
        let prompt: Vec<u32> = (0..14).map(|i| 10 + i % 3).collect();
        let mut q = seq_of(1, prompt.clone());
        q.set_speculation(&SpecParams { method: SpecMethod::Ngram, k: 6 });
        s.add(q);
        let (mut plan, mut out) = plan_out();
        s.schedule(&mut plan, &mut out); // the prefill: no draft
        assert_eq!(out, vec![Scheduled { seq_id: 1, n_tokens: 14, logits: true }]);
        assert!(s.advance(1, 14));
        s.running_mut(1).unwrap().tokens.push(10 + 14 % 3);
        s.schedule(&mut plan, &mut out);
        check_private_writes(&s, &plan);
        let want: Vec<u32> = (15..21).map(|i| 10 + i % 3).collect();
        assert_eq!(s.running()[0].draft, want);
        assert_eq!(out, vec![Scheduled { seq_id: 1, n_tokens: 7, logits: true }]);
        assert_eq!(plan.positions, (14..21).collect::<Vec<u32>>());
        assert_eq!(plan.logit_rows, (0..7).collect::<Vec<u32>>());
        assert_eq!(plan.tokens[1..], want[..]);
        assert_eq!(s.running()[0].block_table.len(), 6, "21 positions in blocks of 4");
        // two draft tokens accepted, then the target's own: positions 14..17 hold K/V
        let q = s.running_mut(1).unwrap();
        q.tokens.extend([want[0], want[1], 99]);
        q.draft.clear();
        assert!(s.advance(1, 3));
        s.trim_to_cached(1);
        check_pool(&s);
        let q = &s.running()[0];
        assert_eq!((q.n_cached, q.tokens.len(), q.block_table.len()), (17, 18, 5));
        assert_eq!(s.pool.n_free(), 12 - 5);
        // Budget: 16 rows; a second decoding sequence keeps its row, the draft takes the rest.
        s.add(seq_of(2, vec![1, 2, 3]));
        s.schedule(&mut plan, &mut out); // 1 decodes (no match for 99: no draft), 2 prefills
        assert_eq!(out.iter().map(|e| e.n_tokens).collect::<Vec<_>>(), vec![1, 3]);
        complete(&mut s, &out);
        check_pool(&s);
        // A pool without room for the draft's blocks: the draft is dropped, nobody preempted.
        let mut s = cached_scheduler(5, 64);
        s.enable_speculation(64);
        let mut q = seq_of(3, prompt.clone());
        q.set_speculation(&SpecParams { method: SpecMethod::Ngram, k: 8 });
        s.add(q);
        step(&mut s);
        *s.running_mut(3).unwrap().tokens.last_mut().unwrap() = 10 + 14 % 3; // a draft to propose
        s.schedule(&mut plan, &mut out);
        assert_eq!(out, vec![Scheduled { seq_id: 3, n_tokens: 1, logits: true }]);
        assert!(s.running()[0].draft.is_empty());
        assert_eq!(s.n_preempted, 0);
        complete(&mut s, &out);
        check_pool(&s);
    }

    /// A hybrid's scheduler (block size 4): state slots, and `n_ckpt` checkpoints when > 0.
    fn hybrid_scheduler(n_ckpt: usize) -> Scheduler {
        let mut s = cached_scheduler(64, 64);
        s.enable_state_slots(9);
        if n_ckpt > 0 {
            s.enable_checkpoints(9, n_ckpt);
        }
        s
    }

    /// A shared 3-block prefix followed by 6 tokens of `x`.
    fn branch_of(x: u32) -> Vec<u32> {
        let mut p: Vec<u32> = (100..112).collect();
        p.extend([x; 6]);
        p
    }

    /// The first step of a new sequence `id` over `prompt`: its tokens in that forward, and the
    /// state copies run before it.
    fn first_step(s: &mut Scheduler, id: u64, prompt: Vec<u32>) -> (usize, Vec<(usize, usize)>) {
        s.take_state_copies();
        s.add(seq_of(id, prompt));
        let out = step(s);
        let copies = s.take_state_copies();
        (out.iter().find(|e| e.seq_id == id).unwrap().n_tokens, copies)
    }

    #[test]
    fn a_hybrids_prefill_is_cut_where_its_kv_hit_ends_and_a_third_prompt_resumes_there() {
        let mut s = hybrid_scheduler(8);
        stream_into_cache(&mut s, 1, &branch_of(1)); // A: cut at its end (16), checkpoint there
        s.take_state_copies();
        // B shares A's first 3 blocks (KV), but no state checkpoint at 12: it computes from 0,
        // cut at its branch point 12, where a checkpoint is taken (kept like a prompt's end).
        s.add(seq_of(2, branch_of(2)));
        let out = step(&mut s);
        assert_eq!(out[0].n_tokens, 12, "B's first forward ends at its branch point");
        assert_eq!(s.running()[0].branch_at, Some(12));
        let copies = s.take_state_copies();
        assert_eq!(copies.len(), 1, "a checkpoint of B's state at 12: {copies:?}");
        let (from, at12) = copies[0];
        assert_eq!(from, s.state_slots.iter().position(|&x| x == Some(2)).unwrap());
        let h12 = (0..3).fold(None, |parent, i| Some(s.pool.hash_block(parent, &branch_of(2)[i * 4..i * 4 + 4]))).unwrap();
        let i = at12 - s.ckpt.first;
        assert_eq!(s.ckpt.slots[i].map(|(h, _, end)| (h, end)), Some((h12, true)), "keyed by block 2's hash, a prompt end's class");
        assert_eq!(step(&mut s)[0].n_tokens, 4, "then to its prompt's end cut (16)");
        assert_eq!(step(&mut s)[0].n_tokens, 2);
        s.remove(2);
        // C resumes from B's branch checkpoint: 12 tokens from the cache, the state copied in.
        s.take_admitted_hits();
        let (n, copies) = first_step(&mut s, 3, branch_of(3));
        assert_eq!(s.take_admitted_hits(), vec![(3, 12)]);
        assert_eq!(n, 4, "C computes from 12 to its end cut");
        assert_eq!(copies.first(), Some(&(at12, s.state_slots.iter().position(|&x| x == Some(3)).unwrap())));
        assert_eq!(s.running()[0].branch_at, Some(0), "C's hit was restored whole: no branch cut");
        // B's branch checkpoint outlives the checkpoints that are not prompt ends: five ends
        // (A's, B's branch and end, C's, D's) and D's decode steps crossing blocks (which evict
        // one another in the three other slots) leave it.
        s.remove(3);
        let mut long = branch_of(4);
        long[0] = 9; // shares nothing
        s.add(seq_of(4, long));
        step(&mut s);
        step(&mut s);
        for _ in 0..20 {
            step(&mut s);
        }
        assert!(s.ckpt.slots.iter().flatten().any(|&(h, _, _)| h == h12), "the branch checkpoint was evicted before decode checkpoints");
    }

    #[test]
    fn no_branch_cut_where_none_is_needed() {
        // Dense: B's hit is taken whole, its rest in one forward (no cut at all).
        let mut d = cached_scheduler(64, 64);
        stream_into_cache(&mut d, 1, &branch_of(1));
        assert_eq!(first_step(&mut d, 2, branch_of(2)).0, 6);
        assert_eq!(d.running()[0].branch_at, Some(0));
        // A hybrid without checkpoints: no hit, the whole prompt in one forward.
        let mut h0 = hybrid_scheduler(0);
        stream_into_cache(&mut h0, 1, &branch_of(1));
        assert_eq!(first_step(&mut h0, 2, branch_of(2)).0, 18);
        assert_eq!(h0.running()[0].branch_at, Some(0));
        // A hybrid whose hit is restored whole (the conversation grows): cut at its end only.
        let mut h = hybrid_scheduler(4);
        stream_into_cache(&mut h, 1, &branch_of(1));
        let mut grown = branch_of(1);
        grown.extend([7, 5, 5, 5, 5, 5, 5]);
        assert_eq!(first_step(&mut h, 2, grown).0, 8, "from A's end checkpoint (16) to its end cut (24)");
        assert_eq!(h.running()[0].branch_at, Some(0));
        h.remove(2);
        // A branch point at the prompt's end cut: that cut takes the checkpoint, no extra one.
        let mut short: Vec<u32> = (100..112).collect();
        short.push(3);
        let mut h = hybrid_scheduler(4);
        stream_into_cache(&mut h, 1, &branch_of(1));
        assert_eq!(first_step(&mut h, 2, short).0, 12);
        assert_eq!(h.running()[0].branch_at, Some(0));
    }

    #[test]
    fn a_branch_point_survives_preemption_and_goes_with_a_quarantined_span() {
        let mut s = hybrid_scheduler(4);
        stream_into_cache(&mut s, 1, &branch_of(1));
        s.add(seq_of(2, branch_of(2)));
        assert_eq!(step(&mut s)[0].n_tokens, 12);
        // Preempted after its branch point: re-admitted, it resumes from its own branch
        // checkpoint, keeps its first branch point (not where its own blocks end) and cuts only
        // at its end.
        s.take_state_copies();
        assert_eq!(s.preempt_last(), 2);
        assert_eq!(first_step(&mut s, 99, vec![50; 3]).0, 3); // another sequence, to step
        let q = s.running().iter().find(|q| q.id == 2).unwrap();
        assert_eq!((q.n_cached, q.branch_at), (16, Some(12)), "resumed at 12, cut at its end 16");
        // A span cut out before the branch point drops it; after it, keeps it.
        s.quarantine_span(2, 14, 15).unwrap();
        assert_eq!(s.running().iter().find(|q| q.id == 2).unwrap().branch_at, Some(12));
        s.quarantine_span(2, 5, 6).unwrap();
        assert_eq!(s.running().iter().find(|q| q.id == 2).unwrap().branch_at, Some(0));
    }

    /// Drafts stop short of the context window and of `max_tokens`, and recurrent models never
    /// draft.
    #[test]
    fn drafts_respect_context_and_max_tokens() {
        use crate::engine::speculative::{SpecMethod, SpecParams};
        let cfg = SchedulerConfig { n_ctx: 20, max_batch: 4, max_tokens: 64, kv_window: None };
        let mut s = Scheduler::new(cfg, BlockPool::new(32, 4, false));
        s.enable_speculation(64);
        let prompt: Vec<u32> = vec![5; 16];
        let mut q = seq_of(1, prompt.clone());
        q.set_speculation(&SpecParams { method: SpecMethod::Ngram, k: 8 });
        s.add(q);
        step(&mut s); // 17 tokens, 16 cached
        *s.running_mut(1).unwrap().tokens.last_mut().unwrap() = 5;
        let (mut plan, mut out) = plan_out();
        s.schedule(&mut plan, &mut out);
        // 17 tokens held: 3 more fit the window of 20, so 2 draft tokens and one of the target's
        assert_eq!(s.running()[0].draft.len(), 2);
        assert_eq!(out[0].n_tokens, 3);
        let cfg = SchedulerConfig { n_ctx: 64, max_batch: 4, max_tokens: 64, kv_window: None };
        let mut s = Scheduler::new(cfg, BlockPool::new(32, 4, false));
        s.enable_speculation(64);
        let mut q = Sequence::new(2, prompt.clone(), Sampler::new(SamplingParams { seed: Some(1), max_tokens: Some(3), ..Default::default() }).unwrap());
        q.set_speculation(&SpecParams { method: SpecMethod::Ngram, k: 8 });
        s.add(q);
        step(&mut s);
        *s.running_mut(2).unwrap().tokens.last_mut().unwrap() = 5;
        s.running_mut(2).unwrap().n_sampled = 1;
        s.schedule(&mut plan, &mut out);
        assert_eq!(s.running()[0].draft.len(), 1, "two tokens left: one drafted, one of the target's");
        // a recurrent model's sequences never draft
        let mut s = Scheduler::new(cfg, BlockPool::new(32, 4, false));
        s.enable_speculation(64);
        s.enable_state_slots(4);
        let mut q = seq_of(3, prompt);
        q.set_speculation(&SpecParams { method: SpecMethod::Ngram, k: 8 });
        s.add(q);
        step(&mut s);
        *s.running_mut(3).unwrap().tokens.last_mut().unwrap() = 5;
        s.schedule(&mut plan, &mut out);
        assert_eq!(out[0].n_tokens, 1);
    }
}
