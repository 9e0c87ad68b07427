//! Python binding of the engine: `fak._native.EngineCore` (contract in ARCHITECTURE.md, "Native
//! engine"). Conversions and locking only; every compute call releases the GIL.
//!
//! Thread safety: the engine sits behind a `Mutex`, taken only after the GIL is released, so a
//! second Python thread calling in waits for the first instead of corrupting state (and never
//! deadlocks on the GIL). Counters that monitoring threads read (free blocks, running, waiting)
//! are mirrored in atomics and never wait for a step.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use numpy::{IntoPyArray, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::detach;
use super::limits::{check_request, token_ids_of, PyRequestLimits};
use crate::backend::RopeStyle;
use crate::engine::speculative::{SpecMethod, SpecParams};
use crate::engine::{Engine, EngineApi, EngineOptions, RequestLimits, SamplingParams};
use crate::model::{RopeOverride, RopeScalingKind};
use crate::FakError;

/// A model loaded into fak's engine: the KV cache, the running sequences and the sampler.
#[pyclass(name = "EngineCore", module = "fak._native", frozen)]
pub struct PyEngineCore {
    engine: Mutex<Box<dyn EngineApi>>,
    backend: &'static str,
    n_ctx: usize,
    n_vocab: usize,
    /// The request rules' limits, fixed at open: checked without the lock (`check_request`).
    limits: RequestLimits,
    config: Vec<(&'static str, ConfigValue)>,
    shard_plan: Vec<ShardRow>,
    kv_total: usize,
    kv_free: AtomicUsize,
    running: AtomicUsize,
    waiting: AtomicUsize,
}

/// One shard of the tensor-parallel plan, as `shard_plan` lists it.
struct ShardRow {
    rank: usize,
    q_heads: (usize, usize),
    kv_heads: (usize, usize),
    ffn: (usize, usize),
    vocab: (usize, usize),
    /// MoE experts held whole (`None`: every expert).
    experts: Option<(usize, usize)>,
}

#[derive(Clone)]
enum ConfigValue {
    Bool(bool),
    Int(usize),
    Float(f64),
    Str(String),
    Ints(Vec<usize>),
}

impl PyEngineCore {
    /// Runs `f` on the engine with the GIL released, then refreshes the mirrored counters.
    fn with_engine<T: Send>(
        &self,
        py: Python<'_>,
        f: impl Send + FnOnce(&mut dyn EngineApi) -> crate::Result<T>,
    ) -> PyResult<T> {
        detach(py, || {
            let mut guard = self.engine.lock().unwrap_or_else(|e| e.into_inner());
            let r = f(guard.as_mut());
            self.kv_free
                .store(guard.kv_blocks_free(), Ordering::Relaxed);
            self.running.store(guard.n_running(), Ordering::Relaxed);
            self.waiting.store(guard.n_waiting(), Ordering::Relaxed);
            r
        })
    }
}

/// The core's sampling params from an `add_sequence` dict, range-checked; a bad key, kind or
/// value is a [`FakError::InvalidArgument`] naming it.
pub(super) fn parse_sampling(d: Option<&Bound<'_, PyDict>>) -> crate::Result<SamplingParams> {
    let mut p = SamplingParams::default();
    let Some(d) = d else { return Ok(p) };
    for (k, v) in d.iter() {
        let key: String = k
            .extract()
            .map_err(|_| FakError::invalid("sampling", "keys must be strings"))?;
        if v.is_none() {
            continue;
        }
        let bad = |what: &str| FakError::invalid(key.as_str(), format!("{v} is not {what}"));
        match key.as_str() {
            "temperature" => p.temperature = v.extract::<f32>().map_err(|_| bad("a number"))?,
            "top_k" => p.top_k = v.extract::<i32>().map_err(|_| bad("an integer"))?,
            "top_p" => p.top_p = v.extract::<f32>().map_err(|_| bad("a number"))?,
            "min_p" => p.min_p = v.extract::<f32>().map_err(|_| bad("a number"))?,
            "repeat_penalty" => p.repeat_penalty = v.extract::<f32>().map_err(|_| bad("a number"))?,
            "repeat_last_n" => p.repeat_last_n = v.extract::<i32>().map_err(|_| bad("an integer"))?,
            "presence_penalty" => p.presence_penalty = v.extract::<f32>().map_err(|_| bad("a number"))?,
            "frequency_penalty" => p.frequency_penalty = v.extract::<f32>().map_err(|_| bad("a number"))?,
            "seed" => p.seed = Some(v.extract::<u64>().map_err(|_| bad("an integer in [0, 2**64)"))?),
            "n_logprobs" => p.n_logprobs = v.extract::<usize>().map_err(|_| bad("a non-negative integer"))?,
            "prefix_choices" => {
                p.prefix_choices = v
                    .extract::<Vec<Vec<u32>>>()
                    .map_err(|_| bad("a list of lists of token ids"))?
            }
            "max_tokens" => p.max_tokens = Some(v.extract::<usize>().map_err(|_| bad("a positive integer"))?),
            "stop_ids" => p.stop_ids = v.extract::<Vec<u32>>().map_err(|_| bad("a list of token ids"))?,
            "speculative" => p.speculative = Some(parse_speculative(&v, "speculative")?),
            other => {
                return Err(FakError::invalid(
                    other,
                    "unknown sampling key; known: temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed, n_logprobs, prefix_choices, max_tokens, stop_ids, speculative",
                ))
            }
        }
    }
    p.validate()?;
    Ok(p)
}

/// A speculation setting: `"none"`, `"ngram"`, `"suffix"`, `"METHOD:K"`, or a dict
/// `{"method": METHOD, "k": K}` (`k` optional). Errors: [`FakError::InvalidArgument`] naming `param`.
fn parse_speculative(v: &Bound<'_, PyAny>, param: &str) -> crate::Result<SpecParams> {
    if let Ok(text) = v.extract::<String>() {
        return SpecParams::parse(&text, param);
    }
    let d = v.cast::<PyDict>().map_err(|_| {
        FakError::invalid(param, format!("{v} is not a string (\"ngram\", \"suffix:8\", \"none\") or a dict {{\"method\": ..., \"k\": ...}}"))
    })?;
    let mut method = None;
    let mut k = None;
    for (key, val) in d.iter() {
        let key: String = key.extract().map_err(|_| FakError::invalid(param, "keys must be strings"))?;
        match key.as_str() {
            "method" => method = Some(val.extract::<String>().map_err(|_| FakError::invalid(param, format!("method {val} is not a string")))?),
            "k" => {
                if !val.is_none() {
                    k = Some(val.extract::<usize>().map_err(|_| FakError::invalid(param, format!("k {val} is not a positive integer")))?)
                }
            }
            other => return Err(FakError::invalid(param, format!("unknown key {other:?} (known: method, k)"))),
        }
    }
    let method = method.ok_or_else(|| FakError::invalid(param, "a dict needs \"method\" (none, ngram, suffix)"))?;
    SpecParams::new(&method, k, param)
}

fn sampling_from_dict(d: Option<&Bound<'_, PyDict>>) -> PyResult<SamplingParams> {
    parse_sampling(d).map_err(super::to_py)
}

/// check_sampling(sampling: dict) -> None | tuple[str, str]
///
/// The one range check of sampling values (the one `add_sequence` applies): `None` when
/// `sampling` (the `add_sequence` dict) is valid, else `(parameter, reason)` for the first value
/// out of range or of the wrong kind. `fak.sampling.SamplingParams` raises its ValueError from
/// this, so that Python and the engine core cannot disagree on a range.
#[pyfunction]
pub(crate) fn check_sampling(sampling: &Bound<'_, PyDict>) -> PyResult<Option<(String, String)>> {
    match parse_sampling(Some(sampling)) {
        Ok(_) => Ok(None),
        Err(FakError::InvalidArgument { param, msg }) => Ok(Some((param, msg))),
        Err(e) => Err(super::to_py(e)),
    }
}

/// `(seq_id, token, logprob, top_logprobs, finish)`; `finish` is `"stop"`, `"length"` or None.
type StepTuple = (u64, u32, f32, Option<Vec<(u32, f32)>>, Option<&'static str>);

// The signature's literal defaults (a text signature shows a path as `...`).
const _: () = assert!(crate::engine::speculative::DEFAULT_MAX_BATCH == 8);

#[pymethods]
impl PyEngineCore {
    /// EngineCore(path, backend="cpu", n_ctx=4096, threads=None, kv_cache_tokens=None, max_batch=64, prefix_cache=True,
    ///       max_tokens_per_step=None, rope_scaling=None, rope_scale=None, yarn_orig_ctx=None,
    ///       tensor_parallel=1, sliding_window=None, free_window_blocks=True, n_cpu_moe=0,
    ///       speculative=None, draft_model=None, speculative_max_batch=8, state_checkpoints=None)
    ///
    /// `backend`: "cpu", "cuda" (fak's CUDA kernels; fak.BackendError without a usable GPU) or
    /// "auto" (cuda when a GPU is usable, else cpu).
    ///
    /// Loads the GGUF model at `path` (memory-mapped; weights stay in their block formats).
    /// `n_ctx`: context window per sequence in tokens; `threads`: worker threads (None: all
    /// cores); `kv_cache_tokens`: KV cache capacity in tokens shared by all sequences (None:
    /// `n_ctx · min(max_batch, 8)`, committed lazily); `max_batch`: most sequences decoded together;
    /// `prefix_cache`: automatic prefix caching (a prompt that starts with full 32-token KV blocks
    /// already computed for an earlier sequence skips their prefill; outputs are unchanged);
    /// `max_tokens_per_step`: most tokens (rows) one forward computes — the prefill chunk (None:
    /// 512; raised to `max_batch` if smaller; the activation buffers grow with it).
    /// `rope_scaling` ("none", "linear", "yarn", "llama3"), `rope_scale` (context extension
    /// factor, > 0) and `yarn_orig_ctx` (the pre-extension context in tokens) override the file's
    /// `{arch}.rope.scaling.*` metadata; None: the file decides (docs/long-context.md).
    /// `tensor_parallel`: shards the forward runs as (Megatron-style, docs/tensor-parallel.md):
    /// on the CPU backend, N shards on threads of this process sharing `threads`, each holding
    /// its heads, FFN columns and vocabulary slice of the weights and its KV heads.
    /// `sliding_window` (tokens, ≥ 0; 0: none) overrides the file's
    /// `{arch}.attention.sliding_window`: windowed layers (the file's
    /// `attention.sliding_window_pattern`, every layer without one) attend to the last
    /// `sliding_window` positions only. When every layer is windowed, each sequence returns the KV
    /// blocks outside its window to the pool (memory bounded by the window, not `n_ctx`);
    /// `free_window_blocks=False` keeps them (same outputs; for tests).
    /// `n_cpu_moe`: the mixture-of-experts experts of the first `n_cpu_moe` layers stay in host
    /// memory and run on the CPU while attention, router and the other layers run on the GPU
    /// (llama.cpp's `--n-cpu-moe`; ≥ n_layer: every layer, `--cpu-moe`; no effect on the CPU
    /// backend or a dense model).
    /// `speculative`: speculative decoding of the requests that do not set their own
    /// (`sampling["speculative"]`): `"ngram"` (prompt lookup), `"suffix"` (suffix index over the
    /// sequence), `"draft"` (the draft model), `"METHOD:K"` (at most K draft tokens per step,
    /// 1..=32; default 4), `"none"` or None (off; `"draft"` when `draft_model` is given). Outputs
    /// are unchanged (docs/speculative.md). Off for hybrid models and `tensor_parallel > 1`
    /// whatever is asked. Each sequence's draft length adapts to its recent acceptance within K.
    /// `speculative_max_batch`: a step with more decoding sequences than this drafts nothing
    /// (speculation's off-switch for large batches).
    /// `state_checkpoints`: a hybrid model's (qwen35 / qwen35moe) checkpoints of recurrent state
    /// for the prefix cache (docs/hybrid.md): a prompt resumes from the cache only up to a block
    /// whose state is checkpointed, so fewer checkpoints than interleaved conversations ×
    /// checkpoints each prompt leaves lose hits. 0..=the KV cache's blocks (None: 8, fewer on a
    /// cache of fewer blocks); each takes
    /// `config["state_slot_bytes"]` (counted in `config["state_bytes"]`). No effect on dense
    /// models or with `prefix_cache=False`.
    /// `draft_model`: a GGUF path of a smaller model with the same tokenizer (Qwen2.5-Coder-0.5B
    /// for the 1.5B), loaded on the same backend with its own KV cache, for the `draft` source;
    /// fak.InvalidArgumentError (`param` "draft_model") for a different vocabulary, a hybrid
    /// (target or draft) or `tensor_parallel > 1`.
    ///
    /// Raises: OSError (cannot open), fak.GGUFError (malformed file), fak.UnsupportedError
    /// (architecture / format), fak.ModelError (missing or mis-shaped tensor), fak.ShardError
    /// (the model cannot be split `tensor_parallel` ways: names the tensor, format and N),
    /// fak.BackendError (`backend="cuda"` without a usable CUDA backend, or with
    /// `tensor_parallel > 1`: multi-GPU is not built), ValueError (bad argument).
    #[new]
    #[pyo3(signature = (path, backend="cpu", n_ctx=4096, threads=None, kv_cache_tokens=None, max_batch=64, prefix_cache=true, max_tokens_per_step=None, rope_scaling=None, rope_scale=None, yarn_orig_ctx=None, tensor_parallel=1, sliding_window=None, free_window_blocks=true, n_cpu_moe=0, speculative=None, draft_model=None, speculative_max_batch=8, state_checkpoints=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        backend: &str,
        n_ctx: usize,
        threads: Option<usize>,
        kv_cache_tokens: Option<usize>,
        max_batch: usize,
        prefix_cache: bool,
        max_tokens_per_step: Option<usize>,
        rope_scaling: Option<&str>,
        rope_scale: Option<f32>,
        yarn_orig_ctx: Option<usize>,
        tensor_parallel: usize,
        sliding_window: Option<usize>,
        free_window_blocks: bool,
        n_cpu_moe: usize,
        speculative: Option<&str>,
        draft_model: Option<PathBuf>,
        speculative_max_batch: usize,
        state_checkpoints: Option<i64>,
    ) -> PyResult<PyEngineCore> {
        let state_checkpoints = state_checkpoints
            .map(|n| usize::try_from(n).map_err(|_| super::to_py(FakError::invalid("state_checkpoints", format!("{n} (must be ≥ 0)")))))
            .transpose()?;
        let speculative = speculative
            .map(|v| SpecParams::parse(v, "speculative"))
            .transpose()
            .map_err(super::to_py)?
            .unwrap_or(if draft_model.is_some() {
                // a draft model drafts by default
                SpecParams { method: SpecMethod::Draft, k: crate::engine::speculative::DEFAULT_DRAFT }
            } else {
                SpecParams::NONE
            });
        if max_tokens_per_step == Some(0) {
            return Err(super::to_py(FakError::invalid("max_tokens_per_step", "0 (must be ≥ 1, or None for 512)")));
        }
        let opts = EngineOptions {
            n_ctx,
            threads,
            kv_cache_tokens,
            max_batch,
            prefix_cache,
            max_tokens_per_step: max_tokens_per_step.unwrap_or(crate::engine::DEFAULT_MAX_TOKENS),
            rope: RopeOverride {
                kind: rope_scaling
                    .map(|name| {
                        RopeScalingKind::from_name(name).map_err(|_| {
                            FakError::invalid("rope_scaling", format!("{name:?} (must be \"none\", \"linear\", \"yarn\" or \"llama3\")"))
                        })
                    })
                    .transpose()
                    .map_err(super::to_py)?,
                factor: rope_scale,
                orig_ctx: yarn_orig_ctx,
                ..RopeOverride::default()
            },
            tensor_parallel,
            sliding_window,
            free_window_blocks,
            n_cpu_moe,
            speculative,
            draft_model: draft_model.clone(),
            speculative_max_batch,
            state_checkpoints,
        };
        let engine: Box<dyn EngineApi> = match backend {
            "cpu" => Box::new(detach(py, || Engine::open_cpu(&path, opts))?),
            "cuda" => open_cuda(py, &path, opts)?,
            "auto" => {
                if cuda_usable(py) {
                    open_cuda(py, &path, opts)?
                } else {
                    Box::new(detach(py, || Engine::open_cpu(&path, opts))?)
                }
            }
            other => return Err(super::to_py(FakError::invalid("backend", format!("{other:?} (must be \"cpu\", \"cuda\" or \"auto\")")))),
        };
        let c = engine.config().clone();
        let state = engine.state_memory();
        let config = vec![
            ("architecture", ConfigValue::Str(c.arch.name().to_string())),
            ("n_layer", ConfigValue::Int(c.n_layer)),
            ("n_embd", ConfigValue::Int(c.n_embd)),
            ("n_ff", ConfigValue::Int(c.n_ff)),
            ("n_head", ConfigValue::Int(c.n_head)),
            ("n_head_kv", ConfigValue::Int(c.n_head_kv)),
            ("head_dim", ConfigValue::Int(c.head_dim)),
            ("n_vocab", ConfigValue::Int(c.n_vocab)),
            ("n_ctx_train", ConfigValue::Int(c.n_ctx_train)),
            ("rms_eps", ConfigValue::Float(c.rms_eps as f64)),
            (
                "rope_type",
                ConfigValue::Str(match c.rope.style {
                    RopeStyle::Neox => "neox".into(),
                    RopeStyle::Norm => "norm".into(),
                }),
            ),
            ("n_rot", ConfigValue::Int(c.rope.n_rot)),
            (
                "rope_freq_base",
                ConfigValue::Float(c.rope.freq_base as f64),
            ),
            (
                "rope_freq_scale",
                ConfigValue::Float(c.rope.freq_scale as f64),
            ),
            ("rope_scaling", ConfigValue::Str(c.rope_scaling.kind.name().into())),
            ("rope_scale", ConfigValue::Float(c.rope_scaling.factor as f64)),
            ("rope_orig_ctx", ConfigValue::Int(c.rope_scaling.orig_ctx)),
            ("rope_ext_factor", ConfigValue::Float(c.rope.ext_factor as f64)),
            ("rope_attn_factor", ConfigValue::Float(c.rope.attn_factor as f64)),
            ("sliding_window", ConfigValue::Int(c.sliding_window)),
            ("n_expert", ConfigValue::Int(c.moe.map_or(0, |m| m.n_expert))),
            ("n_expert_used", ConfigValue::Int(c.moe.map_or(0, |m| m.n_expert_used))),
            ("n_ff_exp", ConfigValue::Int(c.moe.map_or(0, |m| m.n_ff_exp))),
            ("host_expert_layers", ConfigValue::Int(if c.moe.is_some() && engine.backend_name() != "cpu" { n_cpu_moe.min(c.n_layer) } else { 0 })),
            ("swa_layers", ConfigValue::Ints((0..c.n_layer).filter(|&il| c.layer_window(il).is_some()).collect())),
            ("kv_window", ConfigValue::Int(c.kv_window().filter(|_| free_window_blocks).unwrap_or(0))),
            ("kv_block_size", ConfigValue::Int(crate::engine::BLOCK_SIZE)),
            ("threads", ConfigValue::Int(engine.threads())),
            ("max_batch", ConfigValue::Int(max_batch)),
            ("prefix_cache", ConfigValue::Bool(prefix_cache)),
            ("tensor_parallel", ConfigValue::Int(tensor_parallel)),
            (
                "speculative",
                ConfigValue::Str(if c.hybrid.is_some() || tensor_parallel > 1 || !speculative.is_on() {
                    "none".into()
                } else {
                    format!("{}:{}", speculative.method.name(), speculative.k)
                }),
            ),
            ("state_checkpoints", ConfigValue::Int(state.checkpoints)),
            ("state_slot_bytes", ConfigValue::Int(state.slot_bytes)),
            ("state_bytes", ConfigValue::Int(state.bytes())),
            ("draft_model", ConfigValue::Str(draft_model.as_ref().map_or(String::new(), |p| p.display().to_string()))),
        ];
        let shard_plan = engine
            .shard_plan()
            .map(|p| {
                p.shards
                    .iter()
                    .map(|s| ShardRow {
                        rank: s.rank,
                        q_heads: (s.q_heads.start, s.q_heads.end),
                        kv_heads: (s.kv_heads.start, s.kv_heads.end),
                        ffn: (s.ffn.start, s.ffn.end),
                        vocab: (s.vocab.start, s.vocab.end),
                        experts: s.experts.as_ref().map(|e| (e.start, e.end)),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(PyEngineCore {
            backend: engine.backend_name(),
            n_ctx: engine.n_ctx(),
            n_vocab: c.n_vocab,
            limits: engine.request_limits(),
            kv_total: engine.kv_blocks_total(),
            kv_free: AtomicUsize::new(engine.kv_blocks_free()),
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            config,
            shard_plan,
            engine: Mutex::new(engine),
        })
    }

    /// The tensor-parallel partition: one dict per shard, in rank order, with `rank` and the
    /// whole model's `[start, end)` ranges it holds: `q_heads`, `kv_heads` (several shards hold
    /// the same KV head when there are fewer than shards), `ffn` (FFN columns: of a MoE model,
    /// of every expert it holds), `vocab` (LM-head rows) and `experts` (the MoE experts it holds
    /// whole when they are divided among the shards, else `None`); an empty list with one shard.
    #[getter]
    fn shard_plan<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.shard_plan
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("rank", s.rank)?;
                d.set_item("q_heads", s.q_heads)?;
                d.set_item("kv_heads", s.kv_heads)?;
                d.set_item("ffn", s.ffn)?;
                d.set_item("vocab", s.vocab)?;
                d.set_item("experts", s.experts)?;
                Ok(d)
            })
            .collect()
    }

    /// The backend running the model (`"cpu"` or `"cuda"`).
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// Context window per sequence, in tokens.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Vocabulary size (columns of `logits`).
    #[getter]
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// What requests are checked against (`RequestLimits`: `n_ctx`, `n_vocab`, the KV cache's
    /// blocks, with this engine's sliding window and speculation), fixed at open.
    #[getter]
    fn request_limits(&self) -> PyRequestLimits {
        PyRequestLimits { limits: self.limits }
    }

    /// check_request(prompt_ids, sampling=None) -> None
    ///
    /// Raises what `add_sequence(seq_id, prompt_ids, sampling)` would raise for the request, from
    /// the same rules (`RequestLimits.check`), without the engine's lock: it never waits for a
    /// step. fak.InvalidArgumentError, fak.ContextLengthError, fak.KVCacheFullError (the prompt
    /// needs more blocks than the whole cache); a duplicate id or a cache full now are
    /// `add_sequence`'s alone.
    #[pyo3(signature = (prompt_ids, sampling=None))]
    fn check_request(&self, prompt_ids: &Bound<'_, PyAny>, sampling: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        check_request(&self.limits, prompt_ids, sampling)
    }

    /// Hyper-parameters (architecture, n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim,
    /// n_vocab, n_ctx_train, rms_eps, rope_type, n_rot, rope_freq_base, rope_freq_scale,
    /// rope_scaling, rope_scale, rope_orig_ctx, rope_ext_factor, rope_attn_factor, sliding_window
    /// (tokens, 0: none), swa_layers (the indices of the windowed layers)) and engine settings
    /// (kv_block_size, threads, max_batch, prefix_cache, tensor_parallel, kv_window: the window by
    /// which sequences release KV blocks, 0 when they keep them all), as a new dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.config {
            match v {
                ConfigValue::Bool(b) => d.set_item(k, b)?,
                ConfigValue::Int(i) => d.set_item(k, i)?,
                ConfigValue::Float(f) => d.set_item(k, f)?,
                ConfigValue::Str(s) => d.set_item(k, s)?,
                ConfigValue::Ints(v) => d.set_item(k, v.clone())?,
            }
        }
        Ok(d)
    }

    /// KV cache blocks in total (each holds `config["kv_block_size"]` tokens).
    #[getter]
    fn kv_blocks_total(&self) -> usize {
        self.kv_total
    }

    /// KV cache blocks not held by any sequence (as of the end of the last call).
    #[getter]
    fn kv_blocks_free(&self) -> usize {
        self.kv_free.load(Ordering::Relaxed)
    }

    /// Sequences the scheduler runs (at most `max_batch`), as of the end of the last call.
    #[getter]
    fn n_running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Sequences queued in the scheduler (past `max_batch`, or waiting for KV blocks), as of the
    /// end of the last call.
    #[getter]
    fn n_waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// add_sequence(seq_id, prompt_ids, sampling=None, resident_tokens=0, conversation=None)
    ///
    /// Queues a sequence; the next `step()` with room prefills it. `sampling` keys: temperature,
    /// top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty,
    /// seed, n_logprobs, prefix_choices (a list of token-id lists: the output must begin with one
    /// of them), max_tokens (≥ 1: the sequence finishes after that many tokens), stop_ids (token
    /// ids that finish it), speculative (`"ngram"`, `"suffix"`, `"METHOD:K"`, `"none"` or
    /// `{"method": ..., "k": ...}`: this request's speculative decoding over the model's default)
    /// (None values mean the default; unknown keys are errors).
    /// `resident_tokens`: the leading prompt tokens (an agent's system prompt and tools) whose
    /// cached KV blocks get second chances under the prefix cache's LRU when the sequence ends.
    /// `conversation`: the conversation it belongs to (the gateway's `X-Fak-Conversation`): with
    /// the `suffix` draft source it also drafts from the outputs of the conversation's earlier
    /// requests, and its own output joins them when it ends (docs/speculative.md).
    ///
    /// Raises (the rules of `check_request`, `RequestLimits.check`, plus a duplicate id):
    /// fak.InvalidArgumentError, a ValueError (duplicate id, empty prompt, a token id outside
    /// `[0, n_vocab)`, bad or unknown sampling value; `.param` names it: `"seq_id"`, `"prompt_ids"`,
    /// `"temperature"`, ...), fak.ContextLengthError (`len(prompt_ids) + 1 > n_ctx`: `.param`
    /// `"prompt_ids"`; `len(prompt_ids) + max_tokens > n_ctx`: `.param` `"max_tokens"`; with
    /// `.n_prompt`, `.max_tokens`, `.n_tokens`, `.n_ctx`), fak.KVCacheFullError (the prompt needs
    /// more blocks than the whole cache; `.needed`, `.free`).
    #[pyo3(signature = (seq_id, prompt_ids, sampling=None, resident_tokens=0, conversation=None))]
    fn add_sequence(
        &self,
        py: Python<'_>,
        seq_id: u64,
        prompt_ids: &Bound<'_, PyAny>,
        sampling: Option<&Bound<'_, PyDict>>,
        resident_tokens: usize,
        conversation: Option<&str>,
    ) -> PyResult<()> {
        let params = sampling_from_dict(sampling)?;
        let prompt_ids = token_ids_of(&self.limits, prompt_ids, "prompt_ids")?;
        let conversation = conversation.map(|c| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            c.hash(&mut h);
            h.finish()
        });
        self.with_engine(py, move |e| {
            e.add_sequence(seq_id, prompt_ids, params)?;
            if resident_tokens > 0 {
                e.set_resident_prefix(seq_id, resident_tokens);
            }
            if let Some(c) = conversation {
                e.set_conversation(seq_id, c);
            }
            Ok(())
        })
    }

    /// take_prefix_hits() -> list[(seq_id, hit_tokens)]: the prompt tokens each sequence admitted
    /// since the last call found in the prefix cache (their prefill was skipped).
    fn take_prefix_hits(&self, py: Python<'_>) -> PyResult<Vec<(u64, usize)>> {
        self.with_engine(py, |e| Ok(e.take_prefix_hits()))
    }

    /// remove_sequence(seq_id): drops the sequence and frees its KV blocks; unknown ids are a no-op.
    fn remove_sequence(&self, py: Python<'_>, seq_id: u64) -> PyResult<()> {
        self.with_engine(py, move |e| Ok(e.remove_sequence(seq_id)))?;
        Ok(())
    }

    /// step() -> list[(seq_id, token_id, logprob, top_logprobs | None, finish | None)]
    ///
    /// One engine iteration (GIL released): prefill newly added sequences (chunked beyond 512
    /// tokens per step), decode one token for every running sequence, all in one batched forward;
    /// sample; append. `logprob` is the log-softmax of the unmodified logits at the token;
    /// `top_logprobs` is a list of `(token_id, logprob)`, most likely first, when `n_logprobs > 0`.
    /// `finish` is `"stop"` (the token is one of the sequence's `stop_ids`) or `"length"` (its
    /// `max_tokens`-th token, or its context window is full): the engine has then removed the
    /// sequence and freed its KV blocks. With speculative decoding a sequence may get several
    /// tokens in one step: consecutive tuples, in order, only the last one with a finish.
    fn step(&self, py: Python<'_>) -> PyResult<Vec<StepTuple>> {
        let out = self.with_engine(py, |e| e.step())?;
        Ok(out
            .into_iter()
            .map(|o| (o.seq_id, o.token, o.logprob, o.top_logprobs, o.finish.map(|f| f.as_str())))
            .collect())
    }

    /// logits(token_ids) -> np.ndarray float32 [n_tokens, n_vocab]
    ///
    /// Logits at every position of `token_ids`, computed from scratch (stateless; GIL released).
    ///
    /// Raises: fak.InvalidArgumentError (empty list, token id ≥ n_vocab; `.param` `"token_ids"`),
    /// fak.ContextLengthError (`len(token_ids) > n_ctx`; `.param` `"token_ids"`),
    /// fak.KVCacheFullError (no room in the cache right now).
    fn logits<'py>(
        &self,
        py: Python<'py>,
        token_ids: Vec<u32>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let n = token_ids.len();
        let v = self.with_engine(py, move |e| e.logits(&token_ids))?;
        v.into_pyarray(py).reshape([n, self.n_vocab])
    }

    /// stats() -> dict: running, waiting, kv_blocks_used, kv_blocks_total, prefill_tokens,
    /// decode_tokens, prefill_seconds, decode_seconds, sample_seconds, steps, preemptions,
    /// prefix_cache_query_tokens, prefix_cache_hit_tokens, prefix_cache_blocks,
    /// device_sampled_rows, device_sampled_host_rows (rows sampled on the backend, and of those the
    /// ones whose logits it still copied to the host sampler), tp_collective_seconds,
    /// tp_collective_wait_seconds (tensor parallelism: seconds shard 0 spent in the all-reduces
    /// and the logits gather, and of those waiting for the other shards; 0 with one shard),
    /// kv_blocks_peak (the most KV blocks sequences held during one step's forward: a high-water
    /// mark, reset by `reset_stats`), spec_steps, spec_draft_tokens, spec_accepted_tokens
    /// (speculative decoding: sequence-steps that verified a draft, draft tokens computed, and
    /// of those the ones accepted).
    /// Seconds are wall time of `step()` calls, split between prefill and decode by token count.
    /// `prefix_cache_query_tokens` counts the tokens of every admitted sequence (again after a
    /// preemption), `prefix_cache_hit_tokens` those of them whose K/V came from the prefix cache
    /// (not prefilled; `prefill_tokens` counts only computed ones); `prefix_cache_blocks` is the
    /// number of KV blocks in the cache now (in use or free and evictable; `kv_blocks_used`
    /// counts only blocks sequences hold).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with_engine(py, |e| Ok(e.stats()))?;
        let d = PyDict::new(py);
        d.set_item("running", self.running.load(Ordering::Relaxed))?;
        d.set_item("waiting", self.waiting.load(Ordering::Relaxed))?;
        d.set_item(
            "kv_blocks_used",
            self.kv_total - self.kv_free.load(Ordering::Relaxed),
        )?;
        d.set_item("kv_blocks_total", self.kv_total)?;
        d.set_item("prefill_tokens", s.prefill_tokens)?;
        d.set_item("decode_tokens", s.decode_tokens)?;
        d.set_item("prefill_seconds", s.prefill_seconds)?;
        d.set_item("decode_seconds", s.decode_seconds)?;
        d.set_item("sample_seconds", s.sample_seconds)?;
        d.set_item("steps", s.steps)?;
        d.set_item("preemptions", s.preemptions)?;
        d.set_item("prefix_cache_query_tokens", s.prefix_cache_query_tokens)?;
        d.set_item("prefix_cache_hit_tokens", s.prefix_cache_hit_tokens)?;
        d.set_item("prefix_cache_blocks", s.prefix_cache_blocks)?;
        d.set_item("device_sampled_rows", s.device_sampled_rows)?;
        d.set_item("device_sampled_host_rows", s.device_sampled_host_rows)?;
        d.set_item("tp_collective_seconds", s.tp_collective_seconds)?;
        d.set_item("tp_collective_wait_seconds", s.tp_collective_wait_seconds)?;
        d.set_item("kv_blocks_peak", s.kv_blocks_peak)?;
        d.set_item("spec_steps", s.spec_steps)?;
        d.set_item("spec_draft_tokens", s.spec_draft_tokens)?;
        d.set_item("spec_accepted_tokens", s.spec_accepted_tokens)?;
        d.set_item("spec_draft_forwards", s.spec_draft_forwards)?;
        d.set_item("spec_draft_model_tokens", s.spec_draft_model_tokens)?;
        d.set_item("spec_draft_seconds", s.spec_draft_seconds)?;
        d.set_item("draft_kv_blocks_total", s.draft_kv_blocks_total)?;
        d.set_item("draft_kv_blocks_free", s.draft_kv_blocks_free)?;
        Ok(d)
    }

    /// evict_prefix(token_ids, start) -> int
    ///
    /// Quarantine of a span found poisoned after the fact: drops from the prefix cache every KV
    /// block that holds `token_ids[start:]` after `token_ids[:start]` (the span's first block, by
    /// its tokens) and every block chained after those, and bans them: never cached or matched
    /// again. Blocks before `start // kv_block_size` stay. Returns the blocks dropped.
    ///
    /// Raises: ValueError (`start >= len(token_ids)`).
    fn evict_prefix(&self, py: Python<'_>, token_ids: Vec<u32>, start: usize) -> PyResult<usize> {
        self.with_engine(py, move |e| e.evict_prefix(&token_ids, start))
    }

    /// quarantine_span(seq_id, start, end) -> int
    ///
    /// Removes tokens `start:end` (positions of the sequence's prompt + generated tokens) from a
    /// running or waiting sequence: its next steps recompute everything from block
    /// `start // kv_block_size` on, so its KV cache and logits equal those of a sequence that never
    /// held the span; cached blocks holding the span are dropped and banned (see `evict_prefix`).
    /// Returns the cache blocks dropped.
    ///
    /// Raises: ValueError (unknown id, empty or out-of-range span, or a span of every token).
    fn quarantine_span(&self, py: Python<'_>, seq_id: u64, start: usize, end: usize) -> PyResult<usize> {
        self.with_engine(py, move |e| e.quarantine_span(seq_id, start, end))
    }

    /// last_logits(seq_id) -> np.ndarray float32 [n_vocab] | None
    ///
    /// The logits that sampled `seq_id`'s token in the last `step()`, when that step copied logits
    /// to the host (a sequence in it was not plain greedy, e.g. `n_logprobs > 0`); else None.
    fn last_logits<'py>(&self, py: Python<'py>, seq_id: u64) -> PyResult<Option<Bound<'py, numpy::PyArray1<f32>>>> {
        let v = self.with_engine(py, move |e| Ok(e.last_logits(seq_id)))?;
        Ok(v.map(|v| v.into_pyarray(py)))
    }

    /// prefix_cache_contents() -> list[tuple[int, int | None, list[int]]]
    ///
    /// `(hash, parent hash, token ids)` of every KV block in the prefix cache: what a later
    /// request can reuse (for audits and tests).
    fn prefix_cache_contents(&self, py: Python<'_>) -> PyResult<Vec<(u64, Option<u64>, Vec<u32>)>> {
        self.with_engine(py, |e| Ok(e.cached_blocks()))
    }

    /// reset_stats(): zeroes the counters of `stats()`.
    fn reset_stats(&self, py: Python<'_>) -> PyResult<()> {
        self.with_engine(py, |e| {
            e.reset_stats();
            Ok(())
        })
    }

    fn __repr__(&self) -> String {
        let arch = self
            .config
            .iter()
            .find(|(k, _)| *k == "architecture")
            .map(|(_, v)| match v {
                ConfigValue::Str(s) => s.clone(),
                _ => String::new(),
            });
        format!(
            "Model(architecture={:?}, backend={:?}, n_ctx={}, n_vocab={})",
            arch.unwrap_or_default(),
            self.backend,
            self.n_ctx,
            self.n_vocab
        )
    }
}

/// The CUDA engine (`backend="cuda"`): fak.BackendError when this build or machine cannot run it.
#[cfg(feature = "cuda")]
fn open_cuda(py: Python<'_>, path: &std::path::Path, opts: EngineOptions) -> PyResult<Box<dyn EngineApi>> {
    Ok(Box::new(detach(py, || Engine::open_cuda(path, opts))?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_py: Python<'_>, _path: &std::path::Path, _opts: EngineOptions) -> PyResult<Box<dyn EngineApi>> {
    Err(super::to_py(FakError::Backend { backend: "cuda".into(), msg: "this fak build has no CUDA backend (built without the `cuda` feature); use backend=\"cpu\"".into() }))
}

/// `backend="auto"` picks CUDA when a GPU is usable.
fn cuda_usable(py: Python<'_>) -> bool {
    #[cfg(feature = "cuda")]
    {
        py.detach(crate::backend::cuda::available)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = py;
        false
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    use crate::engine::sampler::{MAX_LOGPROBS, MAX_PREFIX_CHOICES, MAX_PREFIX_CHOICE_TOKENS, MAX_STOP_IDS};
    m.add_class::<PyEngineCore>()?;
    m.add_function(wrap_pyfunction!(check_sampling, m)?)?;
    let limits = PyDict::new(m.py());
    limits.set_item("max_logprobs", MAX_LOGPROBS)?;
    limits.set_item("max_prefix_choices", MAX_PREFIX_CHOICES)?;
    limits.set_item("max_prefix_choice_tokens", MAX_PREFIX_CHOICE_TOKENS)?;
    limits.set_item("max_stop_ids", MAX_STOP_IDS)?;
    m.add("SAMPLING_LIMITS", limits)
}
