//! Speculative decoding (Leviathan, Kalman and Matias 2023, arXiv:2211.17192; Chen et al. 2023,
//! arXiv:2302.01318) with model-free drafts: a decoding sequence proposes `k` tokens from its own
//! text, the engine computes them in one forward as `k + 1` rows `[last token, d1 … dk]` with
//! logits on every row, and keeps the longest run the target model agrees with plus one token of
//! its own (docs/speculative.md).
//!
//! Draft sources ([`SpecMethod`]):
//! - `ngram` ([`ngram`]): prompt lookup, the longest suffix of 3..1 tokens seen earlier in the
//!   sequence proposes what followed it;
//! - `suffix` ([`suffix`]): a suffix automaton over the sequence, the longest suffix of any length
//!   seen earlier proposes what followed it, as far as the match is long; a sequence of a
//!   conversation also matches the outputs of the conversation's earlier requests
//!   ([`ConversationStore`]);
//! - `draft` ([`draft_model`]): a second, smaller model of the same vocabulary running in the
//!   same engine (its own paged KV cache) proposes `k` tokens greedily from its own forward over
//!   the sequence's tokens.
//!
//! Verification (the engine's step): greedy sequences accept a draft token while it equals the
//! target's choice at its position (so the output is token for token and log-probability for
//! log-probability that of decoding without speculation, on a backend whose rows do not depend
//! on the batch); sampled sequences use the rejection rule for a deterministic draft (q one-hot):
//! accept `d` with probability `p(d)`, else sample from `p` without `d`, renormalized
//! ([`crate::engine::Sampler::verify`]); the output distribution is the target's. A draft
//! model drafts greedily (argmax), so its proposal distribution is one-hot too and the same rule
//! is exact.
//!
//! Not for hybrid models (their recurrent state cannot be rolled back past rejected tokens) nor
//! tensor parallelism: the engine turns it off there.

pub mod draft_model;
pub mod ngram;
pub mod suffix;

use crate::{FakError, Result};

pub use draft_model::DraftModel;
pub use ngram::NgramIndex;
pub use suffix::{ConversationIndex, ConversationStore, SuffixIndex};

/// Most draft tokens per sequence per step.
pub const MAX_DRAFT: usize = 32;
/// Draft tokens per step when a request names a method without `k`.
pub const DEFAULT_DRAFT: usize = 4;

/// Where draft tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecMethod {
    /// No speculation.
    None,
    /// Prompt lookup ([`ngram`]).
    Ngram,
    /// Suffix automaton over the sequence ([`suffix`]).
    Suffix,
    /// The engine's draft model ([`draft_model`]); only with one attached.
    Draft,
}

impl SpecMethod {
    /// `"none"`, `"ngram"`, `"suffix"` or `"draft"`.
    pub fn name(self) -> &'static str {
        match self {
            SpecMethod::None => "none",
            SpecMethod::Ngram => "ngram",
            SpecMethod::Suffix => "suffix",
            SpecMethod::Draft => "draft",
        }
    }
}

/// A request's (or the engine's default) speculation: the draft source and most draft tokens per
/// step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecParams {
    pub method: SpecMethod,
    /// Most draft tokens per step, 1..=[`MAX_DRAFT`] (ignored for `None`).
    pub k: usize,
}

impl SpecParams {
    /// No speculation.
    pub const NONE: SpecParams = SpecParams { method: SpecMethod::None, k: 0 };

    /// Parses `"none"`, `"ngram"`, `"suffix"`, `"draft"`, or `"METHOD:K"` (`K` in 1..=[`MAX_DRAFT`]).
    /// Errors: [`FakError::InvalidArgument`] naming `param`.
    pub fn parse(spec: &str, param: &str) -> Result<SpecParams> {
        let (name, k) = match spec.split_once(':') {
            Some((n, k)) => {
                let k: usize = k.trim().parse().map_err(|_| {
                    FakError::invalid(param, format!("{spec:?}: the draft length after ':' must be an integer"))
                })?;
                (n.trim(), Some(k))
            }
            None => (spec.trim(), None),
        };
        Self::new(name, k, param)
    }

    /// The method named `name` (`"none"`, `"ngram"`, `"suffix"`, `"draft"`) with `k` draft tokens (default
    /// [`DEFAULT_DRAFT`]). Errors: [`FakError::InvalidArgument`] naming `param`.
    pub fn new(name: &str, k: Option<usize>, param: &str) -> Result<SpecParams> {
        let method = match name {
            "none" | "off" | "" => SpecMethod::None,
            "ngram" => SpecMethod::Ngram,
            "suffix" => SpecMethod::Suffix,
            "draft" => SpecMethod::Draft,
            other => {
                return Err(FakError::invalid(param, format!("{other:?} is not a draft source (known: none, ngram, suffix, draft)")))
            }
        };
        let k = k.unwrap_or(DEFAULT_DRAFT);
        if method != SpecMethod::None && !(1..=MAX_DRAFT).contains(&k) {
            return Err(FakError::invalid(param, format!("k = {k} (draft tokens per step must be in 1..={MAX_DRAFT})")));
        }
        Ok(SpecParams { method, k: if method == SpecMethod::None { 0 } else { k } })
    }

    /// Whether it drafts at all.
    pub fn is_on(&self) -> bool {
        self.method != SpecMethod::None && self.k > 0
    }
}

/// The draft source of one sequence, with its index over the sequence's tokens.
#[derive(Debug, Clone)]
pub enum Drafter {
    Ngram(NgramIndex),
    Suffix(Box<SuffixIndex>),
    /// The draft model's proposal for the current step, set by the engine before it schedules
    /// ([`DraftModel::propose`]) and taken by the first [`Drafter::propose`] after that.
    Model(Vec<u32>),
}

impl Drafter {
    /// The drafter of `p`, `None` when it does not draft.
    pub fn new(p: &SpecParams) -> Option<Drafter> {
        if !p.is_on() {
            return None;
        }
        Some(match p.method {
            SpecMethod::Ngram => Drafter::Ngram(NgramIndex::default()),
            SpecMethod::Suffix => Drafter::Suffix(Box::default()),
            SpecMethod::Draft => Drafter::Model(Vec::new()),
            SpecMethod::None => return None,
        })
    }

    /// Up to `k` tokens proposed to follow `tokens` into `out` (cleared first; possibly empty).
    /// The suffix source also looks in `conversation` (the outputs of earlier requests of the
    /// sequence's conversation) and takes the longer match (the sequence's own on a tie). The
    /// draft model's proposal is taken (a proposal serves one step), its first `k` tokens kept.
    pub fn propose(&mut self, tokens: &[u32], k: usize, conversation: Option<&ConversationIndex>, out: &mut Vec<u32>) {
        match self {
            Drafter::Ngram(ix) => {
                ix.propose(tokens, k, out);
            }
            Drafter::Suffix(ix) => {
                let own = ix.propose(tokens, k, out);
                if let Some(c) = conversation.filter(|c| !c.is_empty()) {
                    let mut other = Vec::new();
                    if c.propose(tokens, k, &mut other) > own && !other.is_empty() {
                        *out = other;
                    }
                }
            }
            Drafter::Model(proposal) => {
                let mut p = std::mem::take(proposal);
                p.truncate(k);
                out.clear();
                out.extend_from_slice(&p);
                p.clear();
                *proposal = p; // its allocation, for the next proposal
            }
        }
    }

    /// Forgets the index (the sequence's tokens changed other than by appending).
    pub fn reset(&mut self) {
        match self {
            Drafter::Ngram(ix) => ix.reset(),
            Drafter::Suffix(ix) => ix.reset(),
            Drafter::Model(proposal) => proposal.clear(),
        }
    }
}

/// Appends to `out` the `k` tokens that follow position `start` of `tokens` followed by `out`
/// itself (an LZ77 copy: when the continuation reaches the end of `tokens` it repeats what it
/// copied, the period `tokens.len() − start`). `start < tokens.len()`.
pub fn copy_continuation(tokens: &[u32], start: usize, k: usize, out: &mut Vec<u32>) {
    debug_assert!(start < tokens.len());
    let l = tokens.len();
    for j in 0..k {
        let src = start + j;
        let t = if src < l { tokens[src] } else { out[src - l] };
        out.push(t);
    }
}

/// Most decoding sequences in a step for which drafts are still scheduled, unless the engine is
/// told otherwise (`speculative_max_batch`): past it a step's extra verification rows cost more
/// than the forwards they save. Measured on the CPU (2-core VM, the 0.5B, agent-trace prompts,
/// `benches/bench_speculative_batch.py`): ngram/suffix drafts gave 1.34–1.43× at 1 sequence,
/// 1.10–1.18× at 4 and 0.98× at 16, so the switch sits between; not yet measured on a GPU
/// (docs/speculative.md).
pub const DEFAULT_MAX_BATCH: usize = 8;

/// A sequence's adaptive draft length (issue 32): the length it drafts this step, between 1 and
/// its request's `k`, from how its recent drafts fared — doubled after a draft accepted whole,
/// cut to one more than the accepted run after a rejection (what the target agreed with, plus
/// the token it would try next); after three verifications in a row that accepted nothing the
/// sequence stops drafting for a pause (1, 2, 4 … 64 of its decode steps, doubling while
/// drafting keeps failing, back to 1 after an accepted token). Greedy outputs do not depend on
/// the length (any draft verifies to the same tokens), so this only moves the cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftControl {
    cur: usize,
    pause: u32,
    misses: u32,
    next_pause: u32,
}

impl DraftControl {
    /// Most consecutive verifications with nothing accepted before a pause.
    pub const MISSES: u32 = 3;
    /// The longest pause, in decode steps.
    pub const MAX_PAUSE: u32 = 64;

    /// Starts at the full length `k`.
    pub fn new(k: usize) -> DraftControl {
        DraftControl { cur: k.max(1), pause: 0, misses: 0, next_pause: 1 }
    }

    /// The length it would draft now (0 while paused), without counting a step.
    pub fn len(&self) -> usize {
        if self.pause > 0 {
            0
        } else {
            self.cur
        }
    }

    /// The length for this decode step (0 while paused; a paused step counts towards the pause).
    pub fn take(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.cur
    }

    /// After a verification of `drafted` tokens (> 0) of which the first `accepted` were kept;
    /// `k` is the request's most draft tokens.
    pub fn update(&mut self, drafted: usize, accepted: usize, k: usize) {
        if drafted == 0 {
            return;
        }
        let k = k.max(1);
        if accepted >= drafted {
            self.cur = (self.cur.max(drafted) * 2).min(k);
        } else {
            self.cur = (accepted + 1).min(k);
        }
        if accepted == 0 {
            self.misses += 1;
            if self.misses >= Self::MISSES {
                self.pause = self.next_pause;
                self.next_pause = (self.next_pause * 2).min(Self::MAX_PAUSE);
                self.misses = 0;
            }
        } else {
            self.misses = 0;
            self.next_pause = 1;
        }
    }
}

/// Draft counters of a sequence (or summed over the engine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecCounts {
    /// Verification steps: steps in which the sequence had a draft.
    pub steps: u64,
    /// Draft tokens proposed (and computed).
    pub drafted: u64,
    /// Draft tokens accepted (emitted as drafted).
    pub accepted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_methods() {
        assert_eq!(SpecParams::parse("ngram", "s").unwrap(), SpecParams { method: SpecMethod::Ngram, k: DEFAULT_DRAFT });
        assert_eq!(SpecParams::parse("suffix:8", "s").unwrap(), SpecParams { method: SpecMethod::Suffix, k: 8 });
        assert_eq!(SpecParams::parse("none", "s").unwrap(), SpecParams::NONE);
        assert!(!SpecParams::parse("none:3", "s").unwrap().is_on());
        assert_eq!(SpecParams::parse("draft:6", "s").unwrap(), SpecParams { method: SpecMethod::Draft, k: 6 });
        for bad in ["ngram:0", "ngram:x", "eagle", "suffix:33", "draft:0"] {
            let e = SpecParams::parse(bad, "speculative").unwrap_err();
            assert!(matches!(e, FakError::InvalidArgument { ref param, .. } if param == "speculative"), "{bad}: {e}");
        }
    }

    /// The draft model's proposal serves one step: the scheduler's `k` cuts it, and a second
    /// look finds nothing until the engine proposes again.
    #[test]
    fn a_model_proposal_is_taken_once() {
        let mut d = Drafter::new(&SpecParams::parse("draft:4", "s").unwrap()).unwrap();
        let mut out = vec![99];
        d.propose(&[1, 2, 3], 4, None, &mut out);
        assert!(out.is_empty(), "nothing proposed yet");
        if let Drafter::Model(p) = &mut d {
            p.extend([5, 6, 7, 8]);
        }
        d.propose(&[1, 2, 3], 2, None, &mut out);
        assert_eq!(out, vec![5, 6]);
        d.propose(&[1, 2, 3], 4, None, &mut out);
        assert!(out.is_empty(), "taken");
    }

    /// Lengths follow acceptance: doubled after a whole draft, one past the accepted run after a
    /// rejection; three empty verifications pause it (1, then 2, 4 … steps), an accepted token
    /// resets the pause.
    #[test]
    fn draft_length_adapts() {
        let mut c = DraftControl::new(8);
        assert_eq!(c.take(), 8);
        c.update(8, 2, 8);
        assert_eq!(c.take(), 3);
        c.update(3, 3, 8);
        assert_eq!(c.take(), 6);
        c.update(2, 2, 8); // the source had only 2: whole, so doubled from the current length
        assert_eq!(c.len(), 8);
        for _ in 0..2 {
            c.update(1, 0, 8);
            assert_eq!(c.take(), 1, "no pause before three misses");
        }
        c.update(1, 0, 8);
        assert_eq!(c.take(), 0, "paused for one step");
        assert_eq!(c.take(), 1);
        for _ in 0..3 {
            c.update(1, 0, 8);
        }
        assert_eq!((c.take(), c.take(), c.take()), (0, 0, 1), "then for two");
        c.update(1, 1, 8);
        for _ in 0..3 {
            c.update(1, 0, 8);
        }
        assert_eq!((c.take(), c.take()), (0, 1), "an accepted token reset the pause to one step");
        let mut long = DraftControl::new(4);
        for _ in 0..40 {
            long.update(1, 0, 4);
            while long.take() == 0 {}
        }
        long.update(1, 0, 4);
        long.update(1, 0, 4);
        long.update(1, 0, 4);
        assert_eq!(long.pause, DraftControl::MAX_PAUSE, "the pause is capped");
    }

    #[test]
    fn continuation_repeats_past_the_end() {
        let mut out = Vec::new();
        copy_continuation(&[1, 2, 3, 4], 2, 5, &mut out);
        assert_eq!(out, vec![3, 4, 3, 4, 3]);
    }
}
