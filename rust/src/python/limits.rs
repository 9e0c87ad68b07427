//! `fak._native.RequestLimits`: the engine's request rules ([`crate::engine::RequestLimits`], the
//! ones `add_sequence` applies) over an immutable snapshot of its limits. A check takes no lock
//! and never waits for a step, so a caller refuses a request before it answers anything (before a
//! stream's HTTP headers), with the errors `add_sequence` would raise.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt};

use super::model::parse_sampling;
use super::to_py;
use crate::engine::{RequestLimits, BLOCK_SIZE};
use crate::FakError;

// The signature's literal default (a text signature shows a path as `...`).
const _: () = assert!(BLOCK_SIZE == 32);

/// What a request is checked against: `n_ctx`, `n_vocab`, `kv_blocks` (of `block_size` tokens).
/// `EngineCore.request_limits` is its engine's (with its sliding window and speculation); one
/// built here (tests, engines that follow the native contract) has neither.
#[pyclass(name = "RequestLimits", module = "fak._native", frozen)]
pub struct PyRequestLimits {
    pub(crate) limits: RequestLimits,
}

#[pymethods]
impl PyRequestLimits {
    /// RequestLimits(n_ctx, n_vocab, kv_blocks, block_size=32)
    #[new]
    #[pyo3(signature = (n_ctx, n_vocab, kv_blocks, block_size=32))]
    fn new(n_ctx: usize, n_vocab: usize, kv_blocks: usize, block_size: usize) -> PyResult<Self> {
        for (name, v) in [("n_ctx", n_ctx), ("n_vocab", n_vocab), ("block_size", block_size)] {
            if v == 0 {
                return Err(to_py(FakError::invalid(name, "0 (must be ≥ 1)")));
            }
        }
        Ok(PyRequestLimits { limits: RequestLimits { block_size, ..RequestLimits::new(n_ctx, n_vocab, kv_blocks) } })
    }

    /// Context window per sequence, in tokens.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.limits.n_ctx
    }

    /// Token ids are `[0, n_vocab)`.
    #[getter]
    fn n_vocab(&self) -> usize {
        self.limits.n_vocab
    }

    /// KV cache blocks in total.
    #[getter]
    fn kv_blocks(&self) -> usize {
        self.limits.kv_blocks
    }

    /// Tokens per KV block.
    #[getter]
    fn block_size(&self) -> usize {
        self.limits.block_size
    }

    /// check(prompt_ids, sampling=None) -> None
    ///
    /// Raises what `EngineCore.add_sequence(seq_id, prompt_ids, sampling)` would for the request
    /// (its rules, not its state: a duplicate id or a full cache now are not seen):
    /// fak.InvalidArgumentError (a bad or unknown sampling value, an empty prompt, a token id
    /// outside `[0, n_vocab)`; `.param`), fak.ContextLengthError (`.param`, `.n_prompt`,
    /// `.max_tokens`, `.n_tokens`, `.n_ctx`), fak.KVCacheFullError (the prompt needs more blocks
    /// than the whole cache). Takes no lock.
    #[pyo3(signature = (prompt_ids, sampling=None))]
    fn check(&self, prompt_ids: &Bound<'_, PyAny>, sampling: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        check_request(&self.limits, prompt_ids, sampling)
    }

    /// check_logits(token_ids) -> None
    ///
    /// Raises what `EngineCore.logits(token_ids)` would for the list: fak.InvalidArgumentError
    /// (empty, or an id outside `[0, n_vocab)`; `.param` `"token_ids"`), fak.ContextLengthError
    /// (more than `n_ctx` ids; `.param` `"token_ids"`).
    fn check_logits(&self, token_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = token_ids_of(&self.limits, token_ids, "token_ids")?;
        self.limits.check_logits(&ids).map_err(to_py)
    }

    fn __repr__(&self) -> String {
        let l = &self.limits;
        format!("RequestLimits(n_ctx={}, n_vocab={}, kv_blocks={}, block_size={})", l.n_ctx, l.n_vocab, l.kv_blocks, l.block_size)
    }
}

/// `limits.check` of a Python request: the sampling dict parsed as `add_sequence` parses it,
/// then the prompt's ids (any integer outside `[0, n_vocab)` is the core's out-of-range error).
pub(crate) fn check_request(
    limits: &RequestLimits,
    prompt_ids: &Bound<'_, PyAny>,
    sampling: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let params = parse_sampling(sampling).map_err(to_py)?;
    let prompt = token_ids_of(limits, prompt_ids, "prompt_ids")?;
    limits.check(&prompt, &params).map_err(to_py)
}

/// The ids of `obj` (a sequence of integers); an integer that is no `u32` is out of range.
pub(crate) fn token_ids_of(limits: &RequestLimits, obj: &Bound<'_, PyAny>, param: &str) -> PyResult<Vec<u32>> {
    if let Ok(ids) = obj.extract::<Vec<u32>>() {
        return Ok(ids);
    }
    let mut ids = Vec::new();
    for item in obj.try_iter()? {
        let item = item?;
        match item.extract::<u32>() {
            Ok(id) => ids.push(id),
            Err(_) if item.is_instance_of::<PyInt>() => return Err(to_py(limits.out_of_range(param, item))),
            Err(_) => {
                return Err(PyTypeError::new_err(format!("{param}: token ids are integers, got {}", item.repr()?)))
            }
        }
    }
    Ok(ids)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRequestLimits>()
}
