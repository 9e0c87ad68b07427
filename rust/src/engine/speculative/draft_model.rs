//! The `draft` source: a second, smaller model of the same vocabulary (Qwen2.5-Coder-0.5B for
//! the 1.5B) in the same engine, on the same backend as the target, proposing `k` tokens per
//! decoding sequence greedily (argmax of its logits) — the scheme of Leviathan et al. 2023
//! (arXiv:2211.17192) and Chen et al. 2023 (arXiv:2302.01318) with a deterministic draft.
//!
//! The draft model keeps its own paged KV cache ([`BlockPool`] without prefix caching) and, per
//! running sequence, the tokens whose K/V that cache holds (a prefix of the sequence's tokens
//! followed by the draft tokens it fed itself). Before each engine step it:
//! 1. forgets the sequences that no longer run (finished, removed or preempted) and returns their
//!    blocks;
//! 2. rolls each decoding sequence back to the longest common prefix of what it holds and the
//!    sequence's tokens (at most all but the last token): rejected draft tokens, and spans a
//!    quarantine cut out, leave its cache exactly as the target's blocks past the accepted run
//!    leave the target's;
//! 3. feeds what it has not seen (the accepted tokens and the target's own token; the whole
//!    prompt the first time, in chunks of the engine's step budget) and then its own argmax
//!    `k − 1` times, every sequence batched in each forward: `k` forwards of the draft model
//!    for `k` draft tokens (the last draft token is not fed: the next step's roll-back would
//!    drop it whenever it is rejected, and feed it when it is accepted).
//!
//! The proposal goes to the sequence's [`Drafter::Model`]; the scheduler takes as much of it as
//! the step's budget allows and the target verifies it as any draft.

use std::collections::{HashMap, HashSet};

use super::Drafter;
use crate::backend::{Backend, BatchLimits, BatchPlan, KvLayout, LogitRows};
use crate::engine::kv_cache::BlockPool;
use crate::engine::sequence::Sequence;
use crate::engine::BLOCK_SIZE;
use crate::model::{Model, ModelConfig, Scratch};
use crate::Result;

/// The draft model of an engine, its KV cache and its state per running sequence.
pub struct DraftModel<B: Backend> {
    model: Model<B>,
    kv: B::KvCache,
    scratch: Scratch<B>,
    pool: BlockPool,
    /// Per sequence id: the tokens whose K/V the draft's cache holds (positions `0..len`), and
    /// its block table.
    seqs: HashMap<u64, DraftSeq>,
    plan: BatchPlan,
    max_tokens: usize,
    max_seqs: usize,
    /// Forwards run and tokens computed (fed) by the draft model since the last
    /// [`DraftModel::reset_stats`].
    pub forwards: u64,
    pub tokens: u64,
}

#[derive(Debug, Default)]
struct DraftSeq {
    tokens: Vec<u32>,
    table: Vec<u32>,
}

/// One sequence's share of a proposal.
struct Work {
    /// Index in the running sequences.
    at: usize,
    id: u64,
    /// Tokens to draft.
    k: usize,
    /// Tokens still to feed the draft model (what it has not seen, then its last argmax).
    feed: Vec<u32>,
    proposal: Vec<u32>,
    done: bool,
}

/// Why `draft` (its configuration and GGUF file) cannot draft for `target`, or `None`: their
/// vocabularies must be the same tokens with the same ids (`tokenizer.ggml.tokens`, and the
/// LM head's `n_vocab`), and the draft cannot be a hybrid (its recurrent state cannot be rolled
/// back past rejected tokens).
pub fn mismatch(target: &ModelConfig, target_file: &crate::gguf::GgufFile, draft: &ModelConfig, draft_file: &crate::gguf::GgufFile) -> Option<String> {
    if draft.hybrid.is_some() {
        return Some(format!(
            "the draft model is a hybrid ({}): its recurrent state cannot be rolled back past rejected draft tokens",
            draft.arch.name()
        ));
    }
    if draft.n_vocab != target.n_vocab {
        return Some(format!(
            "the draft model's vocabulary has {} tokens, the target's {}: a draft must share the target's tokenizer",
            draft.n_vocab, target.n_vocab
        ));
    }
    const TOKENS: &str = "tokenizer.ggml.tokens";
    match (target_file.get_str_array(TOKENS), draft_file.get_str_array(TOKENS)) {
        (Ok(a), Ok(b)) => {
            if a.len() != b.len() {
                return Some(format!(
                    "the draft model's tokenizer has {} tokens, the target's {}: a draft must share the target's tokenizer",
                    b.len(),
                    a.len()
                ));
            }
            if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
                return Some(format!(
                    "the draft model's tokenizer differs from the target's at token id {i} ({:?} vs the target's {:?}): a draft must share the target's tokenizer",
                    b[i], a[i]
                ));
            }
            None
        }
        (Err(_), Err(_)) => None, // neither file carries a tokenizer: the ids are all there is
        _ => Some("one model carries a tokenizer (tokenizer.ggml.tokens) and the other does not: they cannot be checked to share it".into()),
    }
}

impl<B: Backend> DraftModel<B> {
    /// The draft model `model` with a KV cache of `n_blocks` blocks of [`BLOCK_SIZE`] tokens,
    /// forwards of up to `max_tokens` rows over up to `max_seqs` sequences of up to `n_ctx`
    /// tokens. Errors: the backend's (allocation).
    pub fn new(model: Model<B>, n_blocks: usize, max_tokens: usize, max_seqs: usize, n_ctx: usize) -> Result<DraftModel<B>> {
        let c = &model.config;
        let kv = model.backend.alloc_kv_cache(KvLayout {
            n_layer: c.n_layer,
            n_blocks,
            block_size: BLOCK_SIZE,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            state_layers: 0,
            state_slots: 0,
            state_len: 0,
        })?;
        let limits = BatchLimits { max_tokens, max_seqs, max_blocks_per_seq: n_ctx.div_ceil(BLOCK_SIZE) };
        let scratch = Scratch::new(&model, limits, max_seqs)?;
        Ok(DraftModel {
            model,
            kv,
            scratch,
            pool: BlockPool::new(n_blocks, BLOCK_SIZE, false),
            seqs: HashMap::new(),
            plan: BatchPlan::default(),
            max_tokens,
            max_seqs,
            forwards: 0,
            tokens: 0,
        })
    }

    /// The draft model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// Blocks of the draft's KV cache, in total and free.
    pub fn kv_blocks_total(&self) -> usize {
        self.pool.n_total()
    }

    pub fn kv_blocks_free(&self) -> usize {
        self.pool.n_free()
    }

    /// Forgets sequence `id` and returns its blocks.
    pub fn remove(&mut self, id: u64) {
        if let Some(mut st) = self.seqs.remove(&id) {
            self.pool.release(&mut st.table);
        }
    }

    /// Proposes the draft tokens of every decoding sequence of `running` whose drafter is the
    /// draft model (into its [`Drafter::Model`], cleared first for every one of them; see the
    /// module doc): up to its `draft_k` tokens, fewer where the context window of `n_ctx` tokens
    /// or its `max_tokens` leave room for fewer draft tokens and one of the target's. A sequence
    /// whose blocks the draft's cache cannot hold now drafts nothing this step (what it fed so
    /// far is kept).
    ///
    /// Errors: the draft forward's (backend); the state stays consistent (what a failed forward
    /// fed is not counted as held).
    pub fn propose(&mut self, running: &mut [Sequence], n_ctx: usize) -> Result<()> {
        // 1. Only running sequences keep a draft state.
        let live: HashSet<u64> = running.iter().map(|s| s.id).collect();
        let gone: Vec<u64> = self.seqs.keys().filter(|id| !live.contains(id)).copied().collect();
        for id in gone {
            self.remove(id);
        }
        // 2. Roll back to what the sequence still holds; what is left to feed.
        let mut work: Vec<Work> = Vec::new();
        for (at, s) in running.iter_mut().enumerate() {
            let Some(Drafter::Model(proposal)) = s.drafter.as_mut() else { continue };
            proposal.clear();
            let len = s.tokens.len();
            if s.n_pending() != 1 || len >= n_ctx {
                continue; // prefill (or recompute): no draft this step
            }
            let left = s.sampler.params().max_tokens.map_or(usize::MAX, |m| m.saturating_sub(s.n_sampled));
            let k = s.draft_len().min(n_ctx - len - 1).min(left.saturating_sub(1));
            if k == 0 {
                continue;
            }
            let st = self.seqs.entry(s.id).or_default();
            let common = st.tokens.iter().zip(&s.tokens).take_while(|(a, b)| a == b).count().min(len - 1);
            st.tokens.truncate(common);
            let keep = self.pool.blocks_for(common);
            self.pool.release_tail(&mut st.table, keep);
            work.push(Work { at, id: s.id, k, feed: s.tokens[common..].to_vec(), proposal: Vec::with_capacity(k), done: false });
        }
        // 3. Forwards until every proposal is complete.
        let n_vocab = self.model.config.n_vocab;
        let (mut ids, mut lps) = (Vec::new(), Vec::new());
        // (index in `work`, tokens fed, whether its last row has logits) of each member.
        let mut members: Vec<(usize, usize, bool)> = Vec::new();
        loop {
            self.plan.clear();
            members.clear();
            let mut budget = self.max_tokens;
            for (wi, w) in work.iter_mut().enumerate() {
                if w.done || budget == 0 || members.len() == self.max_seqs {
                    continue;
                }
                let st = self.seqs.get_mut(&w.id).expect("a state for each proposal");
                let n = w.feed.len().min(budget);
                let pos = st.tokens.len();
                if self.pool.grow(&mut st.table, pos + n).is_err() {
                    // The draft's cache is full (`grow` took nothing): no draft for this sequence
                    // this step. What it holds stays valid; a later step goes on from there.
                    w.done = true;
                    w.proposal.clear();
                    continue;
                }
                let logits = n == w.feed.len();
                self.plan.push_seq(&w.feed[..n], pos, &st.table, BLOCK_SIZE, if logits { LogitRows::Last } else { LogitRows::None });
                self.plan.set_prompt_len(running[w.at].n_prompt);
                budget -= n;
                members.push((wi, n, logits));
            }
            if members.is_empty() {
                break;
            }
            let n_logits = self.model.forward(&mut self.kv, &mut self.scratch, &self.plan)?;
            self.forwards += 1;
            ids.resize(n_logits, 0);
            lps.resize(n_logits, 0.0);
            if n_logits > 0 {
                self.model.backend.greedy_rows(&self.scratch.logits, n_logits, n_vocab, &mut ids, &mut lps)?;
            }
            let mut row = 0;
            for &(wi, n, logits) in &members {
                let w = &mut work[wi];
                let st = self.seqs.get_mut(&w.id).expect("a state for each proposal");
                st.tokens.extend(w.feed.drain(..n));
                self.tokens += n as u64;
                if logits {
                    let t = ids[row];
                    row += 1;
                    w.proposal.push(t);
                    if w.proposal.len() < w.k {
                        w.feed.push(t);
                    } else {
                        w.done = true;
                    }
                }
            }
        }
        for w in work {
            if let Some(Drafter::Model(p)) = running[w.at].drafter.as_mut() {
                *p = w.proposal;
            }
        }
        Ok(())
    }
}
