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

use std::collections::VecDeque;

use super::kv_cache::BlockPool;
use super::sequence::Sequence;
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
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, pool: BlockPool) -> Scheduler {
        Scheduler {
            cfg,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            n_preempted: 0,
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

    /// Drops the sequence `id` and frees its blocks. Returns whether it existed.
    pub fn remove(&mut self, id: u64) -> bool {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut s = self.running.remove(i);
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

    fn admit(&mut self) {
        let committed: usize = self
            .running
            .iter()
            .map(|s| {
                self.pool
                    .blocks_for(s.tokens.len())
                    .saturating_sub(s.block_table.len())
            })
            .sum();
        let mut available = self.pool.n_free().saturating_sub(committed);
        while self.running.len() < self.cfg.max_batch {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let need = self.pool.blocks_for(front.tokens.len());
            let spare = self.running.len();
            if need + spare > available && !self.running.is_empty() {
                break;
            }
            if need > available {
                break;
            }
            available -= need;
            let seq = self.waiting.pop_front().expect("front exists");
            self.running.push(seq);
        }
    }

    fn preempt_last(&mut self) -> u64 {
        let mut s = self.running.pop().expect("preempt with nothing running");
        self.pool.release(&mut s.block_table);
        s.reset_cache();
        let id = s.id;
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
        let n_ctx = self.cfg.n_ctx;
        let mut budget = self.cfg.max_tokens;
        let mut entries: Vec<Scheduled> = Vec::with_capacity(self.running.len());
        // Decodes first, then prefills, each in admission order.
        for pass_decode in [true, false] {
            for s in &self.running {
                let pending = s.n_pending();
                if pending == 0
                    || (pending == 1) != pass_decode
                    || s.tokens.len() >= n_ctx
                    || budget == 0
                {
                    continue;
                }
                let n = pending.min(budget);
                budget -= n;
                entries.push(Scheduled {
                    seq_id: s.id,
                    n_tokens: n,
                    logits: n == pending,
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
        }
        *out = entries;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::{Sampler, SamplingParams};

    fn seq(id: u64, n: usize) -> Sequence {
        Sequence::new(
            id,
            (0..n as u32).collect(),
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
            let q = s.running_mut(e.seq_id).unwrap();
            q.n_cached += e.n_tokens;
            if e.logits {
                q.tokens.push(7);
            }
        }
    }

    #[test]
    fn decodes_first_then_chunked_prefill() {
        let cfg = SchedulerConfig {
            n_ctx: 256,
            max_batch: 4,
            max_tokens: 16,
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(64, 8));
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
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(64, 4));
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
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(4, 4));
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
        };
        let mut s = Scheduler::new(cfg, BlockPool::new(4, 4));
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
}
