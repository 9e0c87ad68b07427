//! The rules a request must meet before the engine queues it, once: token ids in the vocabulary,
//! the context window, a prompt the KV cache can ever hold, sampling values in range, a draft
//! source the engine has.
//!
//! [`RequestLimits`] is an immutable snapshot of what those rules read (`n_ctx`, `n_vocab`, the
//! KV cache's blocks, ...), fixed when the engine opens. [`Engine::add_sequence`] checks with it,
//! and so can any thread without the engine (`fak._native.EngineCore.check_request` takes no lock
//! and never waits for a step), so that a caller refuses a request before it answers anything,
//! with the errors `add_sequence` would raise.
//!
//! [`Engine::add_sequence`]: super::Engine::add_sequence

use super::speculative::{SpecMethod, SpecParams};
use super::{max_live_blocks, SamplingParams, BLOCK_SIZE};
use crate::{FakError, Result};

/// What a request is checked against (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLimits {
    /// Context window per sequence, in tokens (prompt + generated).
    pub n_ctx: usize,
    /// Token ids are `[0, n_vocab)`.
    pub n_vocab: usize,
    /// KV cache blocks in total.
    pub kv_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most blocks one sequence holds at once when the engine frees blocks outside a sliding
    /// window (every layer windowed), else `None`: a sequence holds its whole context.
    pub live_blocks: Option<usize>,
    /// Speculation of requests that do not set theirs; `None` where speculation is off.
    pub spec_default: Option<SpecParams>,
    /// The engine has a draft model (the `draft` source).
    pub has_draft: bool,
}

impl RequestLimits {
    /// Limits of an engine without speculation, blocks of [`BLOCK_SIZE`] tokens and no window.
    pub fn new(n_ctx: usize, n_vocab: usize, kv_blocks: usize) -> Self {
        RequestLimits {
            n_ctx,
            n_vocab,
            kv_blocks,
            block_size: BLOCK_SIZE,
            live_blocks: None,
            spec_default: None,
            has_draft: false,
        }
    }

    /// Sets the most blocks a sequence holds under a sliding window of `window` tokens, with
    /// forwards of at most `max_tokens` rows ([`max_live_blocks`]).
    pub fn with_window(mut self, window: Option<usize>, max_tokens: usize) -> Self {
        self.live_blocks = window.map(|w| max_live_blocks(w, max_tokens));
        self
    }

    /// The request's checks, in `add_sequence`'s order.
    ///
    /// Errors: [`FakError::InvalidArgument`] for an empty prompt, a token outside the vocabulary
    /// (`param` `"prompt_ids"`, `"prefix_choices"`, `"stop_ids"`), a sampling value out of range
    /// (its name), `"draft"` speculation without a draft model (`"speculative"`);
    /// [`FakError::ContextLength`] when `len(prompt) + 1 > n_ctx` (`param` `"prompt_ids"`) or
    /// `len(prompt) + max_tokens > n_ctx` (`"max_tokens"`); [`FakError::KvCacheFull`] when the
    /// prompt needs more blocks than the whole cache has (it could never run).
    pub fn check(&self, prompt: &[u32], params: &SamplingParams) -> Result<()> {
        self.check_tokens(prompt, "prompt_ids")?;
        if prompt.len() + 1 > self.n_ctx {
            return Err(FakError::context_length(prompt.len(), None, self.n_ctx));
        }
        if let Some(m) = params.max_tokens.filter(|&m| prompt.len() + m > self.n_ctx) {
            return Err(FakError::context_length(prompt.len(), Some(m), self.n_ctx));
        }
        let mut need = (prompt.len() + 1).div_ceil(self.block_size);
        if let Some(live) = self.live_blocks {
            need = need.min(live);
        }
        if need > self.kv_blocks {
            return Err(FakError::KvCacheFull { needed: need, free: self.kv_blocks });
        }
        for choice in &params.prefix_choices {
            self.check_tokens(choice, "prefix_choices")?;
        }
        if !params.stop_ids.is_empty() {
            self.check_tokens(&params.stop_ids, "stop_ids")?;
        }
        let spec = self.speculation(params);
        if spec.is_some_and(|p| p.method == SpecMethod::Draft && p.is_on()) && !self.has_draft {
            return Err(FakError::invalid("speculative", "\"draft\" needs a draft model: this engine has none (draft_model=PATH, --draft-model FILE)"));
        }
        params.validate()
    }

    /// The speculation a request runs with: its own, else the engine's default; `None` where
    /// speculation is off.
    pub fn speculation(&self, params: &SamplingParams) -> Option<SpecParams> {
        self.spec_default.map(|d| params.speculative.unwrap_or(d))
    }

    /// A non-empty list of ids in `[0, n_vocab)`; errors name `param`.
    pub fn check_tokens(&self, tokens: &[u32], param: &str) -> Result<()> {
        if tokens.is_empty() {
            return Err(FakError::invalid(param, "empty token list"));
        }
        match tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            Some(&bad) => Err(self.out_of_range(param, bad)),
            None => Ok(()),
        }
    }

    /// The error of a token id outside the vocabulary (any integer: a caller's negative or too
    /// large id is reported the same way).
    pub fn out_of_range(&self, param: &str, id: impl std::fmt::Display) -> FakError {
        FakError::invalid(param, format!("token id {id} is out of range for a vocabulary of {}", self.n_vocab))
    }

    /// The checks of a stateless `logits` call: a non-empty list of ids in the vocabulary, at
    /// most `n_ctx` of them (`ContextLength`, `param` `"token_ids"`).
    pub fn check_logits(&self, tokens: &[u32]) -> Result<()> {
        self.check_tokens(tokens, "token_ids")?;
        if tokens.len() > self.n_ctx {
            return Err(FakError::ContextLength {
                param: "token_ids".into(),
                n_prompt: tokens.len(),
                max_tokens: None,
                n_ctx: self.n_ctx,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits::new(64, 100, 4)
    }

    #[test]
    fn the_context_window_counts_the_prompt_and_max_tokens() {
        let l = limits();
        let p = SamplingParams::default();
        assert!(l.check(&[1; 63], &p).is_ok());
        let e = l.check(&[1; 64], &p).unwrap_err();
        assert!(matches!(e, FakError::ContextLength { ref param, n_prompt: 64, max_tokens: None, n_ctx: 64 } if param == "prompt_ids"));
        let p = SamplingParams { max_tokens: Some(10), ..Default::default() };
        assert!(l.check(&[1; 54], &p).is_ok());
        let e = l.check(&[1; 55], &p).unwrap_err();
        assert!(matches!(e, FakError::ContextLength { ref param, max_tokens: Some(10), .. } if param == "max_tokens"));
    }

    #[test]
    fn token_ids_and_sampling_values_are_checked() {
        let l = limits();
        let bad = |prompt: &[u32], p: SamplingParams| match l.check(prompt, &p) {
            Err(FakError::InvalidArgument { param, .. }) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(bad(&[], SamplingParams::default()), "prompt_ids");
        assert_eq!(bad(&[100], SamplingParams::default()), "prompt_ids");
        assert_eq!(bad(&[1], SamplingParams { prefix_choices: vec![vec![100]], ..Default::default() }), "prefix_choices");
        assert_eq!(bad(&[1], SamplingParams { stop_ids: vec![5, 100], ..Default::default() }), "stop_ids");
        assert_eq!(bad(&[1], SamplingParams { temperature: -1.0, ..Default::default() }), "temperature");
        let e = l.check(&[3, 100], &SamplingParams::default()).unwrap_err();
        assert_eq!(e.to_string(), l.out_of_range("prompt_ids", 100).to_string());
    }

    #[test]
    fn a_prompt_the_whole_cache_cannot_hold_is_refused_unless_a_window_bounds_it() {
        let l = RequestLimits::new(1024, 100, 2);
        assert!(l.check(&[1; 63], &SamplingParams::default()).is_ok());
        assert!(matches!(l.check(&[1; 64], &SamplingParams::default()), Err(FakError::KvCacheFull { needed: 3, free: 2 })));
        let small = RequestLimits { block_size: 16, ..RequestLimits::new(1024, 100, 3) };
        assert!(matches!(small.check(&[1; 48], &SamplingParams::default()), Err(FakError::KvCacheFull { needed: 4, free: 3 })));
        let windowed = RequestLimits::new(1024, 100, 3).with_window(Some(16), 32);
        assert!(windowed.check(&[1; 500], &SamplingParams::default()).is_ok());
    }

    #[test]
    fn draft_speculation_needs_a_draft_model() {
        let spec = SpecParams::parse("ngram", "speculative").unwrap();
        let l = RequestLimits { spec_default: Some(spec), ..limits() };
        let draft = SamplingParams { speculative: Some(SpecParams::parse("draft", "speculative").unwrap()), ..Default::default() };
        assert!(matches!(l.check(&[1], &draft), Err(FakError::InvalidArgument { ref param, .. }) if param == "speculative"));
        assert!(RequestLimits { has_draft: true, ..l }.check(&[1], &draft).is_ok());
        assert!(limits().check(&[1], &draft).is_ok()); // speculation off: the setting is ignored
    }
}
