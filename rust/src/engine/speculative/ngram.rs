//! Prompt-lookup drafts (Saxena 2023, "prompt lookup decoding"; vLLM's `ngram` proposer,
//! llama.cpp's `--spec-type ngram`): the longest suffix of the sequence, 3 tokens down to 1, that
//! occurred earlier in the sequence (prompt or output) proposes the tokens that followed its
//! latest earlier occurrence.
//!
//! The index maps every 1-, 2- and 3-gram of the sequence to the end of its latest occurrence,
//! updated as tokens are appended (tokens only grow; a span cut out of the sequence resets it).

use std::collections::HashMap;

use super::copy_continuation;

/// The longest n-gram matched.
pub const NGRAM_MAX: usize = 3;

/// The n-gram index of one sequence (see the module doc).
#[derive(Debug, Default, Clone)]
pub struct NgramIndex {
    /// Per n − 1: the n-gram (its ids packed in a `u128`) → the end (exclusive) of its latest
    /// occurrence, over the ends `n ..= indexed`.
    maps: [HashMap<u128, u32>; NGRAM_MAX],
    /// Ends indexed: every n-gram ending at `e ≤ indexed` is in the maps.
    indexed: usize,
}

fn key(gram: &[u32]) -> u128 {
    gram.iter().fold(0u128, |k, &t| (k << 32) | t as u128)
}

impl NgramIndex {
    /// Forgets everything (the sequence's tokens changed other than by appending).
    pub fn reset(&mut self) {
        *self = NgramIndex::default();
    }

    /// Indexes the n-grams ending before the last position of `tokens` (the current suffix itself
    /// is what a proposal looks up, so its own end is left out).
    fn update(&mut self, tokens: &[u32]) {
        let end = tokens.len().saturating_sub(1);
        for e in self.indexed + 1..=end {
            for n in 1..=NGRAM_MAX.min(e) {
                self.maps[n - 1].insert(key(&tokens[e - n..e]), e as u32);
            }
        }
        self.indexed = self.indexed.max(end);
    }

    /// Up to `k` tokens proposed to follow `tokens` into `out` (cleared first): the continuation
    /// of the latest earlier occurrence of the longest suffix of 3, 2 or 1 tokens found; empty
    /// when none occurred. Returns the length of the suffix matched (0: none).
    pub fn propose(&mut self, tokens: &[u32], k: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        self.update(tokens);
        let l = tokens.len();
        for n in (1..=NGRAM_MAX.min(l.saturating_sub(1))).rev() {
            if let Some(&e) = self.maps[n - 1].get(&key(&tokens[l - n..])) {
                copy_continuation(tokens, e as usize, k, out);
                return n;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_suffix_latest_occurrence() {
        let mut ix = NgramIndex::default();
        let mut out = Vec::new();
        // "1 2 3 9 … 1 2 3 7 8 … 2 3" → the 2-gram [2, 3] last occurred before 7
        let toks = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 4, 2, 3];
        assert_eq!(ix.propose(&toks, 3, &mut out), 2);
        assert_eq!(out, vec![7, 8, 4]);
        // the 3-gram [1, 2, 3] wins once it is the suffix
        let toks = [1, 2, 3, 9, 5, 4, 2, 3, 7, 1, 2, 3];
        let mut ix = NgramIndex::default();
        assert_eq!(ix.propose(&toks, 2, &mut out), 3);
        assert_eq!(out, vec![9, 5]);
    }

    #[test]
    fn incremental_equals_fresh_and_runs_repeat() {
        let mut inc = NgramIndex::default();
        let mut toks: Vec<u32> = vec![4, 4];
        let mut out = Vec::new();
        // a run of one token continues periodically past the end of the sequence
        assert_eq!(inc.propose(&toks, 5, &mut out), 1);
        assert_eq!(out, vec![4; 5]);
        let mut x = 7u32;
        for _ in 0..300 {
            x = x.wrapping_mul(1103515245).wrapping_add(12345) % 11;
            toks.push(x);
            let mut fresh = NgramIndex::default();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            assert_eq!(inc.propose(&toks, 4, &mut a), fresh.propose(&toks, 4, &mut b));
            assert_eq!(a, b);
        }
        // nothing earlier matches a new token
        toks.push(99);
        assert_eq!(inc.propose(&toks, 4, &mut out), 0);
        assert!(out.is_empty());
    }
}
