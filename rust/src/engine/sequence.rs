//! One generation request inside the engine: its tokens, how many of them have K/V in the cache,
//! its block table and its sampler.

use super::sampler::Sampler;

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
    /// Physical KV blocks holding positions `i·block_size ..` for each logical block `i`.
    pub block_table: Vec<u32>,
    /// Sampling settings and state.
    pub sampler: Sampler,
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
            sampler,
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

    /// Forgets the cached K/V (after preemption): everything is recomputed on resumption.
    pub fn reset_cache(&mut self) {
        self.n_cached = 0;
    }
}
