//! The engine: sequences, the paged KV cache, the continuous-batching step and the sampler, on top
//! of a [`Model`] on any [`Backend`].
//!
//! [`Engine::step`] is one iteration: admit waiting sequences, run ONE forward containing every
//! running sequence's pending tokens (prefill chunks and one decode token each, concatenated, each
//! with its own positions and block table), sample a token for every sequence whose pending run
//! ended, append it. The engine is driven by one thread (the Python engine loop); it owns a rayon
//! pool of `threads` workers and runs every forward and sampling inside it.
//!
//! With the prefix cache on (the default), a sequence whose tokens start with full KV blocks
//! already in the cache skips their prefill (see [`kv_cache`] and [`scheduler`]); the output is
//! the same bits as without it, since every op of a forward computes each row independently of
//! the others in the batch.
//!
//! With `tensor_parallel = N > 1` the forward runs as `N` shards ([`crate::parallel`]): one
//! scheduler and one logical block table, and each shard's KV cache holds its own KV heads for
//! the same block ids; sampling reads the logits gathered on rank 0.
//!
//! Sliding-window attention (docs/long-context.md): when every layer of the model is windowed
//! (`ModelConfig::kv_window`), sequences return the KV blocks outside the window to the pool as
//! they advance, so one sequence holds at most `⌈(W − 1 + max_tokens)/32⌉ + 1` blocks however long
//! it runs; `n_ctx` stays the longest sequence (the largest position), and the KV cache only needs
//! room for the windows (its default size follows).

mod device_sample;
pub mod kv_cache;
mod limits;
mod open;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod speculative;

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BatchLimits, BatchPlan, KvLayout, LogitRows, NO_BLOCK};
use crate::model::{Model, ModelConfig, Scratch};
use crate::parallel::{ShardPlan, ShardedModel};
use crate::{FakError, Result};

pub use kv_cache::BlockPool;
pub use limits::RequestLimits;
pub use sampler::{Sampled, Sampler, SamplingParams};
pub use scheduler::{Scheduled, Scheduler, SchedulerConfig};
pub use sequence::Sequence;

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 32;
/// Most rows per forward by default (prefill chunk size).
pub const DEFAULT_MAX_TOKENS: usize = 512;
/// Most rows whose logits one forward computes (`logits()` runs in chunks of this many tokens).
pub const LOGITS_CHUNK: usize = 64;

/// Engine settings (the `fak._native.EngineCore` constructor arguments).
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Context window per sequence, in tokens (≥ 2).
    pub n_ctx: usize,
    /// Worker threads; `None`: the physical cores (see `physical_cores`).
    pub threads: Option<usize>,
    /// KV cache capacity in tokens shared by all sequences (≥ `n_ctx`); `None`:
    /// `n_ctx · min(max_batch, 8)`.
    pub kv_cache_tokens: Option<usize>,
    /// Most sequences decoded together (≥ 1).
    pub max_batch: usize,
    /// Most tokens per forward (prefill chunk); raised to `max_batch` if smaller.
    pub max_tokens_per_step: usize,
    /// Automatic prefix caching: reuse the K/V of full blocks of earlier sequences' tokens.
    pub prefix_cache: bool,
    /// RoPE scaling over the file's (`crate::model::rope_scaling`); default: the file decides.
    pub rope: crate::model::RopeOverride,
    /// Tensor-parallel shards the forward runs as (≥ 1; `crate::parallel`). CPU backend only:
    /// `threads` are divided among the shards.
    pub tensor_parallel: usize,
    /// Sliding window in tokens over the file's `{arch}.attention.sliding_window` (`Some(0)`: no
    /// window); the layers that take it are the file's pattern, every layer without one.
    pub sliding_window: Option<usize>,
    /// Return KV blocks outside the window to the pool when every layer is windowed (default).
    /// Off, sequences keep every block (the same outputs, memory growing with the sequence): for
    /// tests and debugging.
    pub free_window_blocks: bool,
    /// The first this many layers' MoE experts stay in host memory and run on the CPU
    /// (llama.cpp's `--n-cpu-moe`; `usize::MAX`: every layer, `--cpu-moe`; 0: none). The
    /// attention, router and other weights stay on the backend. No effect on the CPU backend.
    pub n_cpu_moe: usize,
    /// Speculative decoding of requests that do not set their own
    /// ([`SamplingParams::speculative`]); default none. Off for hybrid models and tensor
    /// parallelism whatever is asked ([`speculative`]).
    pub speculative: speculative::SpecParams,
    /// A draft model (GGUF path) for the `draft` source ([`speculative::draft_model`]): loaded
    /// on the target's backend by [`Engine::open_cpu`] / `Engine::open_cuda`, which
    /// refuse it for hybrid targets, tensor parallelism and a different vocabulary.
    pub draft_model: Option<std::path::PathBuf>,
    /// Speculation's off-switch: a step with more decoding sequences than this drafts nothing
    /// ([`speculative::DEFAULT_MAX_BATCH`]).
    pub speculative_max_batch: usize,
    /// A hybrid model's checkpoints of recurrent state for the prefix cache (0: none, so its
    /// prompts never resume from the cache; at most the KV cache's blocks, each checkpoint being
    /// keyed by one; `None`: [`DEFAULT_STATE_CHECKPOINTS`], fewer on a cache of fewer blocks).
    /// No effect on dense models.
    pub state_checkpoints: Option<usize>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: 4096,
            threads: None,
            kv_cache_tokens: None,
            max_batch: 64,
            max_tokens_per_step: DEFAULT_MAX_TOKENS,
            prefix_cache: true,
            rope: crate::model::RopeOverride::default(),
            tensor_parallel: 1,
            sliding_window: None,
            free_window_blocks: true,
            n_cpu_moe: 0,
            speculative: speculative::SpecParams::NONE,
            draft_model: None,
            speculative_max_batch: speculative::DEFAULT_MAX_BATCH,
            state_checkpoints: None,
        }
    }
}

/// The most KV blocks (of [`BLOCK_SIZE`]) one sequence holds under a sliding window of `window`
/// tokens on every layer with forwards of up to `max_tokens` rows: a chunk at positions
/// `q .. q + C` (`C ≤ max_tokens`) reads from `q + 1 − W`, a span of `W − 1 + C` positions, which
/// lies in at most `⌈(W − 1 + C)/32⌉ + 1` blocks.
pub fn max_live_blocks(window: usize, max_tokens: usize) -> usize {
    (window.max(1) - 1 + max_tokens).div_ceil(BLOCK_SIZE) + 1
}

/// Why the engine finished a sequence (it is removed in the step that returns this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It sampled one of its `stop_ids`.
    Stop,
    /// It sampled `max_tokens` tokens, or its context window is full.
    Length,
}

impl Finish {
    /// `"stop"` or `"length"` (OpenAI's `finish_reason`).
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// The token a step produced for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    pub seq_id: u64,
    pub token: u32,
    /// log-softmax of the unmodified logits at `token`.
    pub logprob: f32,
    /// `(token, logprob)` of the `n_logprobs` most likely tokens, or `None`.
    pub top_logprobs: Option<Vec<(u32, f32)>>,
    /// Set when this token finished the sequence: the engine has removed it (its KV blocks are
    /// free, its full blocks stay in the prefix cache), so the caller need not.
    pub finish: Option<Finish>,
}

/// Counters since creation or the last [`Engine::reset_stats`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Prompt (and recomputed) tokens processed.
    pub prefill_tokens: u64,
    /// Tokens processed one per sequence per step after their prompt.
    pub decode_tokens: u64,
    /// Wall seconds of steps, split between prefill and decode in proportion to their tokens.
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Of those, seconds spent sampling.
    pub sample_seconds: f64,
    /// Forward calls made by `step()`.
    pub steps: u64,
    /// Most KV blocks held at once by sequences during a forward of `step()` (a high-water mark:
    /// with a sliding window on every layer, bounded by the windows whatever the lengths).
    pub kv_blocks_peak: u64,
    /// Sequences preempted for lack of KV blocks (recomputed later).
    pub preemptions: u64,
    /// Tokens looked up in the prefix cache (every admitted sequence's tokens, again after a
    /// preemption) and, of those, tokens whose K/V was found there instead of computed.
    pub prefix_cache_query_tokens: u64,
    pub prefix_cache_hit_tokens: u64,
    /// KV blocks in the prefix cache now (held by sequences or free and evictable); a gauge.
    pub prefix_cache_blocks: u64,
    /// Rows sampled by device sampling ([`device_sample`]) and, of those, rows it copied to the
    /// host sampler (a nucleus wider than the candidates, prefix choices, …).
    pub device_sampled_rows: u64,
    pub device_sampled_host_rows: u64,
    /// Tensor parallelism: seconds rank 0 spent in collectives (the two all-reduces per layer and
    /// the logits gather) and, of those, waiting at their barriers for the other shards (their
    /// imbalance rather than data movement); 0 with one shard.
    pub tp_collective_seconds: f64,
    pub tp_collective_wait_seconds: f64,
    /// Speculative decoding ([`speculative`]): verifications (a sequence's step with a draft),
    /// draft tokens computed, and of those, accepted (emitted as drafted). Tokens per
    /// verification: `(spec_accepted_tokens + spec_steps) / spec_steps` (one of the target's own
    /// each, unless the request ended inside the run).
    pub spec_steps: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    /// The draft model's forwards, the tokens it computed in them, and the seconds its
    /// proposals took (inside `step`); its KV cache blocks in total and free now (0 without a
    /// draft model).
    pub spec_draft_forwards: u64,
    pub spec_draft_model_tokens: u64,
    pub spec_draft_seconds: f64,
    pub draft_kv_blocks_total: u64,
    pub draft_kv_blocks_free: u64,
}

/// The recurrent-state memory of a hybrid model's engine, counted with the KV cache: one slot per
/// running sequence, one for `Engine::logits`, and the prefix cache's checkpoints (all zero for
/// dense models).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateMemory {
    /// State slots in all (`KvLayout::state_slots`).
    pub slots: usize,
    /// Of them, checkpoints for the prefix cache.
    pub checkpoints: usize,
    /// Bytes of one slot: every Gated DeltaNet layer's convolution and recurrent state, f32.
    pub slot_bytes: usize,
}

impl StateMemory {
    fn of(layout: &KvLayout, checkpoints: usize) -> StateMemory {
        StateMemory {
            slots: layout.state_slots,
            checkpoints: if layout.state_slots > 0 { checkpoints } else { 0 },
            slot_bytes: layout.state_layers * layout.state_len * std::mem::size_of::<f32>(),
        }
    }

    /// Bytes of every slot.
    pub fn bytes(&self) -> usize {
        self.slots * self.slot_bytes
    }
}

/// The object-safe face of an engine on any backend (what the Python binding holds).
pub trait EngineApi: Send {
    fn backend_name(&self) -> &'static str;
    fn config(&self) -> &ModelConfig;
    fn n_ctx(&self) -> usize;
    fn kv_blocks_total(&self) -> usize;
    fn kv_blocks_free(&self) -> usize;
    /// The recurrent state's slots and bytes beside the KV blocks (hybrid models).
    fn state_memory(&self) -> StateMemory;
    fn n_running(&self) -> usize;
    fn n_waiting(&self) -> usize;
    /// What a request is checked against ([`Engine::request_limits`]).
    fn request_limits(&self) -> RequestLimits;
    fn add_sequence(&mut self, seq_id: u64, prompt: Vec<u32>, params: SamplingParams)
        -> Result<()>;
    fn remove_sequence(&mut self, seq_id: u64) -> bool;
    /// Sets the leading prompt tokens of `seq_id` whose cached blocks stay resident
    /// ([`BlockPool::mark_resident`]); false for an unknown id.
    fn set_resident_prefix(&mut self, seq_id: u64, n_tokens: usize) -> bool;
    /// Sets the conversation of `seq_id` (its drafts also come from the conversation's earlier
    /// outputs, and its output joins them); false for an unknown id.
    fn set_conversation(&mut self, seq_id: u64, conversation: u64) -> bool;
    /// `(seq_id, prompt tokens found in the prefix cache)` of each sequence admitted since the
    /// last call.
    fn take_prefix_hits(&mut self) -> Vec<(u64, usize)>;
    fn step(&mut self) -> Result<Vec<StepOutput>>;
    fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    fn stats(&self) -> EngineStats;
    fn reset_stats(&mut self);
    fn threads(&self) -> usize;
    fn evict_prefix(&mut self, tokens: &[u32], start: usize) -> Result<usize>;
    fn quarantine_span(&mut self, seq_id: u64, start: usize, end: usize) -> Result<usize>;
    fn last_logits(&self, seq_id: u64) -> Option<Vec<f32>>;
    fn cached_blocks(&self) -> Vec<(u64, Option<u64>, Vec<u32>)>;
    /// The tensor-parallel partition (`None` with one shard).
    fn shard_plan(&self) -> Option<&ShardPlan>;
}

/// What runs the forward: one model, or tensor-parallel shards.
enum Core<B: Backend> {
    One { model: Model<B>, kv: B::KvCache, scratch: Scratch<B> },
    Sharded(ShardedModel<B>),
}

impl<B: Backend> Core<B> {
    /// The whole model's hyper-parameters.
    fn config(&self) -> &ModelConfig {
        match self {
            Core::One { model, .. } => &model.config,
            Core::Sharded(m) => &m.config,
        }
    }

    /// The backend that holds the logits (rank 0's when sharded).
    fn backend(&self) -> &B {
        match self {
            Core::One { model, .. } => &model.backend,
            Core::Sharded(m) => m.backend(),
        }
    }

    /// `[max_logits, n_vocab]` logits of the last forward.
    fn logits(&self) -> &B::Buffer {
        match self {
            Core::One { scratch, .. } => &scratch.logits,
            Core::Sharded(m) => m.logits(),
        }
    }

    fn backend_logits_mut(&mut self) -> (&B, &mut B::Buffer) {
        match self {
            Core::One { model, scratch, .. } => (&model.backend, &mut scratch.logits),
            Core::Sharded(m) => m.backend_logits_mut(),
        }
    }

    fn forward(&mut self, plan: &BatchPlan) -> Result<usize> {
        match self {
            Core::One { model, kv, scratch } => model.forward(kv, scratch, plan),
            Core::Sharded(m) => m.forward(plan),
        }
    }

    /// Copies recurrent-state slot `from` to slot `to` (a hybrid model's checkpoints).
    fn copy_state(&mut self, from: usize, to: usize) -> Result<()> {
        match self {
            Core::One { model, kv, .. } => model.backend.copy_state(kv, from, to),
            Core::Sharded(_) => Err(FakError::Unsupported("tensor parallelism of a hybrid model".into())),
        }
    }
}

/// Checkpoints of recurrent state a hybrid model keeps for its prefix cache by default
/// ([`EngineOptions::state_checkpoints`]; each a whole sequence's state of every Gated DeltaNet
/// layer: 63 MiB for Qwen3.6-35B-A3B, 150 MiB for the 27B; on the CPU the pages are committed as
/// they are written).
pub const DEFAULT_STATE_CHECKPOINTS: usize = 8;

/// Sizes of the KV cache and the batches, from the options (checked).
struct Sizes {
    n_blocks: usize,
    limits: BatchLimits,
    max_logits: usize,
    /// The sliding window whose outside blocks sequences return to the pool (every layer
    /// windowed and `free_window_blocks`), else `None`.
    kv_window: Option<usize>,
    /// Checkpoint slots of recurrent state (hybrid models; `EngineOptions::state_checkpoints`).
    state_checkpoints: usize,
}

impl Sizes {
    /// The engine's sizes for `opts` and the model's `config` (its sliding window already set).
    fn of(opts: &EngineOptions, config: &ModelConfig) -> Result<Sizes> {
        let n_ctx = opts.n_ctx;
        if n_ctx < 2 {
            return Err(FakError::invalid("n_ctx", format!("{n_ctx} (must be ≥ 2)")));
        }
        if opts.max_batch == 0 {
            return Err(FakError::invalid("max_batch", "0 (must be ≥ 1)"));
        }
        if opts.tensor_parallel == 0 {
            return Err(FakError::invalid("tensor_parallel", "0 (must be ≥ 1)"));
        }
        let max_tokens = opts.max_tokens_per_step.max(opts.max_batch).max(LOGITS_CHUNK);
        let kv_window = config.kv_window().filter(|_| opts.free_window_blocks);
        // What one sequence may hold at once: its whole context, or with a window on every layer
        // the window plus one chunk (see `max_live_blocks`).
        let seq_tokens = match kv_window {
            Some(w) => n_ctx.min(max_live_blocks(w, max_tokens) * BLOCK_SIZE),
            None => n_ctx,
        };
        let kv_tokens = opts.kv_cache_tokens.unwrap_or(seq_tokens * opts.max_batch.min(8));
        if kv_tokens < seq_tokens {
            return Err(FakError::invalid("kv_cache_tokens", match kv_window {
                None => format!("{kv_tokens} is smaller than n_ctx {n_ctx}; the cache must hold one full context"),
                Some(w) => format!("{kv_tokens} is smaller than {seq_tokens}, what one sequence holds with a sliding window of {w} and {max_tokens}-token steps"),
            }));
        }
        let n_blocks = kv_tokens.div_ceil(BLOCK_SIZE);
        // At most one checkpoint per cached block: the default gives way to a small cache (a
        // dense model has no state at all), a larger count asked for is an error.
        let state_checkpoints = match opts.state_checkpoints {
            None => DEFAULT_STATE_CHECKPOINTS.min(n_blocks),
            Some(n) if n > n_blocks => {
                return Err(FakError::invalid(
                    "state_checkpoints",
                    format!("{n} is more than the KV cache's {n_blocks} blocks (each checkpoint is kept for one cached block)"),
                ));
            }
            Some(n) => n,
        };
        Ok(Sizes {
            n_blocks,
            limits: BatchLimits {
                max_tokens,
                max_seqs: opts.max_batch.max(1),
                max_blocks_per_seq: n_ctx.div_ceil(BLOCK_SIZE),
            },
            max_logits: opts.max_batch.max(LOGITS_CHUNK),
            kv_window,
            state_checkpoints: if opts.prefix_cache { state_checkpoints } else { 0 },
        })
    }

    fn kv_layout(&self, c: &ModelConfig) -> KvLayout {
        KvLayout {
            n_layer: c.n_layer,
            n_blocks: self.n_blocks,
            block_size: BLOCK_SIZE,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            state_layers: c.hybrid.as_ref().map_or(0, |h| h.recurrent.iter().filter(|&&r| r).count()),
            // one slot per running sequence, one for `Engine::logits`, and the checkpoints
            state_slots: if c.hybrid.is_some() { self.limits.max_seqs + 1 + self.state_checkpoints } else { 0 },
            state_len: c.hybrid.as_ref().map_or(0, |h| h.state_len()),
        }
    }
}

/// A model plus its KV cache, scheduler and thread pool.
pub struct Engine<B: Backend> {
    core: Core<B>,
    sched: Scheduler,
    pool: Arc<rayon::ThreadPool>,
    n_ctx: usize,
    plan: BatchPlan,
    scheduled: Vec<Scheduled>,
    /// The logits rows copied to the host for sampling (grown, never shrunk; its first
    /// `host_rows.len() · n_vocab` elements are the last step's).
    host_logits: Option<B::HostBuf>,
    /// Sequence of each row of `host_logits` when the last step copied its logits to the host
    /// (any sequence not plain greedy), else empty: [`Engine::last_logits`].
    host_rows: Vec<u64>,
    /// Sampling on the backend ([`device_sample`]) instead of copying logits rows to the host:
    /// [`Backend::samples_on_device`], or `FAK_DEVICE_SAMPLING=0/1`.
    device_sampling: bool,
    device: device_sample::DeviceSampling,
    stats: EngineStats,
    /// Rank 0's collective seconds at the last [`Engine::reset_stats`].
    collective_base: (f64, f64),
    /// Most rows per forward, and most of them with logits.
    max_tokens: usize,
    max_logits: usize,
    /// Speculation of requests that do not set theirs; `None` where it is off (hybrid models,
    /// tensor parallelism).
    spec_default: Option<speculative::SpecParams>,
    /// The `draft` source's model ([`Engine::attach_draft`]).
    draft: Option<speculative::DraftModel<B>>,
    state_memory: StateMemory,
}

impl Engine<CpuBackend> {
    /// Threads of each tensor-parallel shard's pool (empty with one shard).
    pub fn shard_threads(&self) -> Vec<usize> {
        match &self.core {
            Core::One { .. } => Vec::new(),
            Core::Sharded(m) => m.threads(),
        }
    }
}

/// The default engine pool size: the physical cores this process may run on (SMT siblings
/// counted once: two threads on one core's siblings share its vector units and gain little on the
/// matmul kernels, and llama.cpp also defaults to physical cores), from Linux's
/// `/sys/devices/system/cpu/cpuN/topology/core_cpus_list` over the CPUs of the affinity mask;
/// elsewhere, or when that cannot be read, `available_parallelism`.
fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[cfg(target_os = "linux")]
    {
        let allowed = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Cpus_allowed_list:"))?.split(':').nth(1)?.trim().to_string();
            let mut cpus = Vec::new();
            for part in line.split(',') {
                let mut ends = part.split('-').map(|v| v.trim().parse::<usize>());
                let a = ends.next()?.ok()?;
                let b = ends.next().map_or(Ok(a), |r| r).ok()?;
                cpus.extend(a..=b);
            }
            Some(cpus)
        });
        if let Some(cpus) = allowed {
            let mut cores = std::collections::HashSet::new();
            for c in &cpus {
                let path = format!("/sys/devices/system/cpu/cpu{c}/topology/core_cpus_list");
                match std::fs::read_to_string(&path) {
                    Ok(siblings) => {
                        cores.insert(siblings.trim().to_string());
                    }
                    Err(_) => return logical,
                }
            }
            if !cores.is_empty() {
                return cores.len().min(logical);
            }
        }
    }
    logical
}

/// Checks the draft-model options before anything loads: `speculative = "draft"` needs a draft
/// model, and a draft model does not run with tensor parallelism.
///
/// Errors: [`FakError::InvalidArgument`] naming `speculative` or `draft_model`.
pub fn check_draft_options(opts: &EngineOptions) -> Result<()> {
    if opts.draft_model.is_some() && opts.tensor_parallel > 1 {
        return Err(FakError::invalid(
            "draft_model",
            format!("a draft model does not run with tensor_parallel={} (speculative decoding is off for tensor parallelism)", opts.tensor_parallel),
        ));
    }
    if opts.speculative.method == speculative::SpecMethod::Draft && opts.draft_model.is_none() {
        return Err(FakError::invalid("speculative", "\"draft\" needs a draft model (draft_model=PATH, --draft-model FILE)"));
    }
    Ok(())
}

/// The error of `tensor_parallel > 1` where it is not built: every backend but the CPU (whose
/// shards [`Engine::open_cpu`] loads from the file).
pub fn tensor_parallel_unavailable(backend: &str, n: usize) -> FakError {
    let msg = if backend == "cpu" {
        format!("tensor_parallel={n} needs the model opened by Engine::open_cpu (each shard loads its own slices)")
    } else {
        format!(
            "tensor_parallel={n}: multi-GPU tensor parallelism (NCCL) is not built; fak shards a model on the CPU backend only (docs/tensor-parallel.md)"
        )
    };
    FakError::Backend { backend: backend.into(), msg }
}

fn build_pool(threads: Option<usize>) -> Result<Arc<rayon::ThreadPool>> {
    let n = match threads {
        Some(0) => {
            return Err(FakError::invalid(
                "threads",
                "0 (must be ≥ 1, or None for the physical cores)",
            ))
        }
        Some(n) => n,
        None => physical_cores(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("fak-cpu-{i}"))
        .build()
        .map_err(|e| FakError::Backend {
            backend: "cpu".into(),
            msg: format!("thread pool: {e}"),
        })?;
    Ok(Arc::new(pool))
}

impl<B: Backend> Engine<B> {
    /// An engine for `model` with a new pool of `opts.threads` workers.
    ///
    /// Errors: as [`Engine::with_core`]'s checks; [`FakError::InvalidArgument`] for
    /// `opts.draft_model` (a path: open the draft [`Model`] and [`Engine::attach_draft`] it).
    pub fn new(model: Model<B>, opts: EngineOptions) -> Result<Engine<B>> {
        if opts.draft_model.is_some() {
            return Err(FakError::invalid("draft_model", "Engine::new takes the draft as a Model: open it on the backend and call attach_draft"));
        }
        let pool = build_pool(opts.threads)?;
        Self::with_pool(model, opts, pool)
    }

    fn with_pool(
        mut model: Model<B>,
        opts: EngineOptions,
        pool: Arc<rayon::ThreadPool>,
    ) -> Result<Engine<B>> {
        if opts.tensor_parallel > 1 {
            return Err(tensor_parallel_unavailable(model.backend.name(), opts.tensor_parallel));
        }
        if let Some(w) = opts.sliding_window {
            model.config.set_sliding_window(w)?;
        }
        let sizes = Sizes::of(&opts, &model.config)?;
        let kv = model.backend.alloc_kv_cache(sizes.kv_layout(&model.config))?;
        let scratch = Scratch::new(&model, sizes.limits, sizes.max_logits)?;
        Self::with_core(Core::One { model, kv, scratch }, opts, sizes, pool)
    }

    fn with_core(core: Core<B>, opts: EngineOptions, sizes: Sizes, pool: Arc<rayon::ThreadPool>) -> Result<Engine<B>> {
        // A hybrid model's recurrent state is not in the KV blocks: a prefix-cache hit resumes
        // from a checkpoint of the state at the hit's last block (`Scheduler::enable_checkpoints`).
        let hybrid = core.config().hybrid.is_some();
        let state_memory = StateMemory::of(&sizes.kv_layout(core.config()), sizes.state_checkpoints);
        let mut sched = Scheduler::new(
            SchedulerConfig {
                n_ctx: opts.n_ctx,
                max_batch: opts.max_batch,
                max_tokens: sizes.limits.max_tokens,
                kv_window: sizes.kv_window,
            },
            BlockPool::new(sizes.n_blocks, BLOCK_SIZE, opts.prefix_cache),
        );
        if hybrid {
            sched.enable_state_slots(sizes.limits.max_seqs + 1);
            if sizes.state_checkpoints > 0 {
                sched.enable_checkpoints(sizes.limits.max_seqs + 1, sizes.state_checkpoints);
            }
        }
        // Speculative decoding rolls back past rejected draft tokens: not a recurrent state
        // (hybrids), and not built for shards.
        let spec_default = (!hybrid && matches!(core, Core::One { .. })).then_some(opts.speculative);
        if spec_default.is_some() {
            sched.enable_speculation(sizes.max_logits);
            sched.set_speculation_max_batch(opts.speculative_max_batch);
        }
        let device_sampling = match std::env::var("FAK_DEVICE_SAMPLING").as_deref() {
            Ok("0") => false,
            Ok("1") => true,
            _ => core.backend().samples_on_device(),
        };
        Ok(Engine {
            core,
            sched,
            pool,
            n_ctx: opts.n_ctx,
            plan: BatchPlan::default(),
            scheduled: Vec::new(),
            host_logits: None,
            host_rows: Vec::new(),
            device_sampling,
            device: device_sample::DeviceSampling::default(),
            stats: EngineStats::default(),
            collective_base: (0.0, 0.0),
            max_tokens: sizes.limits.max_tokens,
            max_logits: sizes.max_logits,
            spec_default,
            draft: None,
            state_memory,
        })
    }

    /// Attaches `draft` (on the same backend) as the engine's draft model: the `draft` source of
    /// speculative decoding ([`speculative::draft_model`]). Its KV cache holds as many blocks as
    /// the target's plus one per sequence of `max_batch` (the draft tokens past a sequence's
    /// blocks).
    ///
    /// Errors: [`FakError::InvalidArgument`] naming `draft_model` when speculation is off for
    /// this engine (a hybrid target, tensor parallelism), when the draft is a hybrid, or when
    /// its vocabulary differs from the target's (`n_vocab` or `tokenizer.ggml.tokens`); the
    /// backend's errors (allocation).
    pub fn attach_draft(&mut self, draft: Model<B>) -> Result<()> {
        let Core::One { model, .. } = &self.core else {
            return Err(FakError::invalid("draft_model", "a draft model does not run with tensor parallelism"));
        };
        if self.spec_default.is_none() {
            return Err(FakError::invalid(
                "draft_model",
                format!("speculative decoding is off for a hybrid target ({}): its recurrent state cannot be rolled back past rejected draft tokens", model.config.arch.name()),
            ));
        }
        if let Some(why) = speculative::draft_model::mismatch(&model.config, &model.file, &draft.config, &draft.file) {
            return Err(FakError::invalid("draft_model", why));
        }
        let n_blocks = self.sched.pool.n_total() + self.sched.cfg.max_batch;
        self.draft = Some(speculative::DraftModel::new(draft, n_blocks, self.max_tokens, self.sched.cfg.max_batch, self.n_ctx)?);
        Ok(())
    }

    /// Whether a draft model is attached ([`Engine::attach_draft`]).
    pub fn has_draft_model(&self) -> bool {
        self.draft.is_some()
    }

    /// What a request is checked against ([`RequestLimits`]): fixed once the engine is open
    /// (and its draft model attached).
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            n_ctx: self.n_ctx,
            n_vocab: self.core.config().n_vocab,
            kv_blocks: self.sched.pool.n_total(),
            block_size: BLOCK_SIZE,
            live_blocks: None,
            spec_default: self.spec_default,
            has_draft: self.draft.is_some(),
        }
        .with_window(self.sched.cfg.kv_window, self.sched.cfg.max_tokens)
    }

    /// Queues a new sequence. It is prefilled by the next step that has room for it.
    ///
    /// Errors: [`FakError::InvalidArgument`] for a duplicate id; then those of
    /// [`RequestLimits::check`] (the one place of the request's rules): an empty prompt, a token
    /// outside the vocabulary or a bad sampling value; [`FakError::ContextLength`] when
    /// `len(prompt) + 1 > n_ctx` (`param` `"prompt_ids"`) or `len(prompt) + max_tokens > n_ctx`
    /// (`param` `"max_tokens"`); [`FakError::KvCacheFull`] when the prompt needs more blocks than
    /// the whole cache has (it could never run).
    pub fn add_sequence(
        &mut self,
        seq_id: u64,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<()> {
        if self.sched.contains(seq_id) {
            return Err(FakError::invalid(
                "seq_id",
                format!("sequence {seq_id} already exists"),
            ));
        }
        let limits = self.request_limits();
        limits.check(&prompt, &params)?;
        let spec = limits.speculation(&params);
        let sampler = Sampler::new(params)?;
        let mut seq = Sequence::new(seq_id, prompt, sampler);
        if let Some(spec) = spec {
            seq.set_speculation(&spec);
        }
        self.sched.add(seq);
        Ok(())
    }

    /// Drops a sequence and frees its KV blocks. Unknown ids are ignored; returns whether it existed.
    pub fn remove_sequence(&mut self, seq_id: u64) -> bool {
        if let Some(d) = self.draft.as_mut() {
            d.remove(seq_id);
        }
        self.sched.remove(seq_id)
    }

    /// One engine iteration (see the module doc). Returns one output per sequence that got a new
    /// token, in batch order; empty when nothing can run.
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        let pool = self.pool.clone();
        pool.install(|| self.step_inner())
    }

    fn step_inner(&mut self) -> Result<Vec<StepOutput>> {
        let t0 = Instant::now();
        if let Some(d) = self.draft.as_mut() {
            // The draft model's proposals, which the scheduler takes as drafts.
            let (f0, n0) = (d.forwards, d.tokens);
            d.propose(self.sched.running_all_mut(), self.n_ctx)?;
            self.stats.spec_draft_forwards += d.forwards - f0;
            self.stats.spec_draft_model_tokens += d.tokens - n0;
            self.stats.spec_draft_seconds += t0.elapsed().as_secs_f64();
        }
        self.sched.schedule(&mut self.plan, &mut self.scheduled);
        self.sync_sched_stats();
        if self.scheduled.is_empty() {
            return Ok(Vec::new());
        }
        self.stats.kv_blocks_peak = self.stats.kv_blocks_peak.max(self.sched.pool.n_used() as u64);
        // A hybrid's recurrent-state checkpoints: taken after the last forward, restored into
        // sequences admitted on a prefix-cache hit.
        for (from, to) in self.sched.take_state_copies() {
            self.core.copy_state(from, to)?;
        }
        let n_logits = self.core.forward(&self.plan)?;
        let n_vocab = self.core.config().n_vocab;
        // Logit rows in row order: one per scheduled entry with logits, or for a verification
        // (a sequence with a draft: speculative decoding) one per row, `1 + draft` of them.
        let mut row_of: Vec<u64> = Vec::with_capacity(n_logits);
        // Verifications: (sequence id, its first logit row, its rows).
        let mut verify: Vec<(u64, usize, usize)> = Vec::new();
        for e in self.scheduled.iter().filter(|e| e.logits) {
            let drafted = self.sched.running().iter().any(|s| s.id == e.seq_id && !s.draft.is_empty());
            if drafted {
                verify.push((e.seq_id, row_of.len(), e.n_tokens));
                row_of.extend(std::iter::repeat_n(e.seq_id, e.n_tokens));
            } else {
                row_of.push(e.seq_id);
            }
        }
        debug_assert_eq!(row_of.len(), n_logits);
        let all_greedy = row_of.iter().all(|id| {
            self.sched
                .running()
                .iter()
                .any(|s| s.id == *id && s.sampler.is_plain_greedy())
        });
        // Verifications of sampled sequences read whole rows on the host.
        let device_sampling = self.device_sampling && verify.is_empty();
        let mut greedy = (Vec::new(), Vec::new());
        self.host_rows.clear();
        if all_greedy {
            greedy = (vec![0u32; n_logits], vec![0f32; n_logits]);
            self.core.backend().greedy_rows(
                self.core.logits(),
                n_logits,
                n_vocab,
                &mut greedy.0,
                &mut greedy.1,
            )?;
        } else if device_sampling {
            // sampled below, on the backend
        } else {
            let need = n_logits * n_vocab;
            if self.host_logits.as_ref().is_none_or(|b| b.len() < need) {
                // Grown in powers of two of rows: a few allocations over the engine's life
                // (page-locked memory is slow to allocate).
                let rows = n_logits.next_power_of_two();
                self.host_logits = None; // the old one is freed first
                self.host_logits = Some(self.core.backend().host_buffer(rows * n_vocab)?);
            }
            let host = self.host_logits.as_mut().expect("allocated above");
            self.core.backend().read_f32(self.core.logits(), &mut host[..need])?;
            self.host_rows.clone_from(&row_of);
        }
        let t_fwd = Instant::now();

        // Token accounting before the sequences change.
        let (mut n_prefill, mut n_decode) = (0u64, 0u64);
        for e in &self.scheduled {
            let s = self
                .sched
                .running()
                .iter()
                .find(|s| s.id == e.seq_id)
                .expect("scheduled sequence runs");
            if (e.n_tokens == 1 || !s.draft.is_empty()) && s.n_cached >= s.n_prompt {
                n_decode += e.n_tokens as u64;
            } else {
                n_prefill += e.n_tokens as u64;
            }
        }

        // Sample every sequence whose run ended, in parallel.
        let logits: &[f32] = self.host_logits.as_deref().unwrap_or(&[]);
        let greedy = &greedy;
        let mut work: Vec<(usize, &mut Sequence)> = self
            .sched
            .running_all_mut()
            .iter_mut()
            .filter(|s| s.draft.is_empty())
            .filter_map(|s| row_of.iter().position(|&id| id == s.id).map(|j| (j, s)))
            .collect();
        let sample = |(j, s): &mut (usize, &mut Sequence)| -> (usize, StepOutput) {
            if all_greedy {
                return (
                    *j,
                    StepOutput {
                        seq_id: s.id,
                        token: greedy.0[*j],
                        logprob: greedy.1[*j],
                        top_logprobs: None,
                        finish: None,
                    },
                );
            }
            let row = &logits[*j * n_vocab..(*j + 1) * n_vocab];
            let out = s.sampler.sample(row, &s.tokens);
            (
                *j,
                StepOutput {
                    seq_id: s.id,
                    token: out.token,
                    logprob: out.logprob,
                    top_logprobs: out.top_logprobs,
                    finish: None,
                },
            )
        };
        // Greedy rows were decided on the device: nothing to spread over the pool (waking its
        // workers for 2 numbers a row cost 1.3–3 ms a step on a busy 16-core host).
        let mut outputs: Vec<(usize, StepOutput)> = if device_sampling && !all_greedy {
            let (backend, logits) = self.core.backend_logits_mut();
            let (out, on_host) = self.device.sample(backend, logits, n_vocab, &mut work)?;
            self.stats.device_sampled_rows += out.len() as u64;
            self.stats.device_sampled_host_rows += on_host;
            out
        } else if work.len() > 1 && !all_greedy {
            work.par_iter_mut().map(sample).collect()
        } else {
            work.iter_mut().map(sample).collect()
        };
        drop(work);

        // Verifications: each sequence keeps the longest run of its draft the target agrees with
        // and one token of the target's; the tokens are appended and the end of the request
        // decided token by token, in order (`speculative`).
        let n_ctx = self.n_ctx;
        let mut verified: Vec<(usize, Vec<StepOutput>, usize)> = Vec::new();
        if !verify.is_empty() {
            let rows = if all_greedy { VerifyRows::Greedy(&greedy.0, &greedy.1) } else { VerifyRows::Host(logits, n_vocab) };
            let mut vwork: Vec<(usize, &mut Sequence)> = self
                .sched
                .running_all_mut()
                .iter_mut()
                .filter(|s| !s.draft.is_empty())
                .map(|s| (verify.iter().find(|v| v.0 == s.id).expect("a drafted sequence is verified").1, s))
                .collect();
            let run = |(j, s): &mut (usize, &mut Sequence)| {
                let (out, accepted) = verify_draft(s, *j, &rows, n_ctx);
                (*j, out, accepted)
            };
            verified = if vwork.len() > 1 && !all_greedy {
                vwork.par_iter_mut().map(run).collect()
            } else {
                vwork.iter_mut().map(run).collect()
            };
            for (_, out, accepted) in &verified {
                self.stats.spec_steps += 1;
                self.stats.spec_accepted_tokens += *accepted as u64;
                let rows = verify.iter().find(|v| v.0 == out[0].seq_id).expect("verified").2;
                self.stats.spec_draft_tokens += (rows - 1) as u64;
            }
        }

        // Commit: cached counts (full blocks enter the prefix cache), new tokens. A verified
        // sequence's tokens are in already; its K/V counts up to its last token kept, and the
        // blocks that only held rejected draft tokens go back to the pool.
        for e in &self.scheduled {
            let kept = verified.iter().find(|v| v.1[0].seq_id == e.seq_id).map(|v| v.1.len());
            let known = self.sched.advance(e.seq_id, kept.unwrap_or(e.n_tokens));
            debug_assert!(known, "scheduled sequence runs");
            if kept.is_some() {
                self.sched.trim_to_cached(e.seq_id);
            }
        }
        // The core decides the end of a request: a stop id, `max_tokens`, or a full context
        // window finishes the sequence here (vLLM's `check_stop`), and frees it.
        for (_, o) in outputs.iter_mut() {
            let s = self
                .sched
                .running_mut(o.seq_id)
                .expect("sampled sequence runs");
            o.finish = commit_token(s, o.token, n_ctx);
        }
        for (j0, out, _) in verified {
            if !self.host_rows.is_empty() {
                // `last_logits`: the row of the last token kept
                let rows = verify.iter().find(|v| v.1 == j0).expect("verified").2;
                for r in j0..j0 + rows {
                    if r + 1 != j0 + out.len() {
                        self.host_rows[r] = u64::MAX;
                    }
                }
            }
            outputs.extend(out.into_iter().enumerate().map(|(i, o)| (j0 + i, o)));
        }
        outputs.sort_by_key(|o| o.0);
        for (_, o) in &outputs {
            if o.finish.is_some() {
                self.sched.remove(o.seq_id);
                if let Some(d) = self.draft.as_mut() {
                    d.remove(o.seq_id);
                }
            }
        }
        let t1 = Instant::now();
        let total = (t1 - t0).as_secs_f64();
        let frac_prefill = n_prefill as f64 / (n_prefill + n_decode).max(1) as f64;
        self.stats.prefill_tokens += n_prefill;
        self.stats.decode_tokens += n_decode;
        self.stats.prefill_seconds += total * frac_prefill;
        self.stats.decode_seconds += total * (1.0 - frac_prefill);
        self.stats.sample_seconds += (t1 - t_fwd).as_secs_f64();
        self.stats.steps += 1;
        Ok(outputs.into_iter().map(|o| o.1).collect())
    }

    /// Logits of every position of `tokens` (`[n_tokens · n_vocab]`, row-major), computed from
    /// scratch (no sequence state is kept). Runs in chunks of [`LOGITS_CHUNK`] tokens through the
    /// shared KV cache, which must have room for the whole list (with a sliding window on every
    /// layer: for one chunk and its windows, blocks before them are released as it goes).
    ///
    /// Errors: [`FakError::InvalidArgument`] for an empty list or a token outside the vocabulary,
    /// [`FakError::ContextLength`] when `len(tokens) > n_ctx`, [`FakError::KvCacheFull`] when the
    /// free blocks cannot hold it now.
    pub fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let pool = self.pool.clone();
        pool.install(|| self.logits_inner(tokens))
    }

    fn logits_inner(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.request_limits().check_logits(tokens)?;
        let n_vocab = self.core.config().n_vocab;
        let mut out: Vec<f32> =
            crate::backend::cpu::zeroed_vec(tokens.len() * n_vocab, "the logits array")?;
        let mut table = Vec::new();
        let window = self.sched.cfg.kv_window;
        if window.is_none() {
            self.sched.pool.grow(&mut table, tokens.len())?;
        }
        let chunk = self.max_logits.min(self.max_tokens);
        let mut result = Ok(());
        // A hybrid model's recurrent state: a slot of its own (the spare one) for these tokens.
        const LOGITS_SEQ: u64 = u64::MAX;
        let state_slot = self.sched.recurrent().then(|| self.sched.state_slot(LOGITS_SEQ));
        for (ci, toks) in tokens.chunks(chunk).enumerate() {
            let n_past = ci * chunk;
            if let Some(w) = window {
                // Only the chunk's windows are held: release what the first row no longer sees,
                // take blocks for the chunk.
                let dead = ((n_past + 1).saturating_sub(w) / BLOCK_SIZE).min(table.len());
                for b in &mut table[..dead] {
                    if *b != NO_BLOCK {
                        self.sched.pool.release_one(std::mem::replace(b, NO_BLOCK));
                    }
                }
                if let Err(e) = self.sched.pool.grow(&mut table, n_past + toks.len()) {
                    result = Err(e);
                    break;
                }
            }
            let mut plan = std::mem::take(&mut self.plan);
            plan.clear();
            plan.push_seq(toks, n_past, &table, BLOCK_SIZE, LogitRows::All);
            plan.set_prompt_len(tokens.len());
            if let Some(slot) = state_slot {
                plan.set_state_slot(slot);
            }
            let r = self.core.forward(&plan);
            self.plan = plan;
            match r {
                Ok(n) => {
                    debug_assert_eq!(n, toks.len());
                    if let Err(e) = self.core.backend().read_f32(
                        self.core.logits(),
                        &mut out[n_past * n_vocab..(n_past + n) * n_vocab],
                    ) {
                        result = Err(e);
                        break;
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.sched.pool.release(&mut table);
        if state_slot.is_some() {
            self.sched.free_state_slot(LOGITS_SEQ);
        }
        result.map(|_| out)
    }

    /// Drops from the prefix cache every block that holds `tokens[start..]` after
    /// `tokens[..start]` and every block chained after those, and bans them (never cached or
    /// matched again); see [`Scheduler::evict_prefix`]. The gateway calls this when a tool result
    /// it passed is found poisoned after the fact. Returns the blocks dropped.
    ///
    /// Errors: [`FakError::InvalidArgument`] for `start >= len(tokens)`.
    pub fn evict_prefix(&mut self, tokens: &[u32], start: usize) -> Result<usize> {
        if start >= tokens.len() {
            return Err(FakError::invalid(
                "start",
                format!("{start} is not a position of the {} tokens", tokens.len()),
            ));
        }
        Ok(self.sched.evict_prefix(tokens, start))
    }

    /// Removes tokens `start..end` (positions in the sequence: prompt, then generated tokens)
    /// from sequence `seq_id`, running or waiting. Its KV cache, and the logits of its next
    /// steps, are then bit-identical to those of a sequence whose tokens never held the span:
    /// the KV blocks before `start / 32` are kept (their K/V depends on earlier tokens only; with
    /// blocks released outside a sliding window, only when the window of position
    /// `start / 32 · 32` is still held, else everything is recomputed),
    /// everything after is recomputed by the following steps (a chunked prefill, as after a
    /// preemption; its last row yields the next token), and every prefix-cache block that held
    /// the span, or is chained after one, is dropped and banned. Returns the cache blocks dropped.
    ///
    /// Errors: [`FakError::InvalidArgument`] for an unknown id, `start >= end`, `end` past the
    /// sequence's tokens, or a span covering every token.
    pub fn quarantine_span(&mut self, seq_id: u64, start: usize, end: usize) -> Result<usize> {
        let n = self
            .sched
            .sequence_mut(seq_id)
            .map(|s| s.tokens.len())
            .ok_or_else(|| FakError::invalid("seq_id", format!("no sequence {seq_id}")))?;
        if start >= end || end > n || end - start >= n {
            return Err(FakError::invalid(
                "span",
                format!("{start}..{end} is not a span of sequence {seq_id}'s {n} tokens that leaves one"),
            ));
        }
        Ok(self
            .sched
            .quarantine_span(seq_id, start, end)
            .expect("the sequence exists"))
    }

    /// The logits row of `seq_id` from the last step, when that step copied logits to the host
    /// (some sequence in it was not plain greedy: sampling, penalties or `n_logprobs > 0`) and
    /// produced a token for `seq_id`; `[n_vocab]` f32.
    /// Turns device sampling ([`device_sample`]) on or off (default: the backend's choice).
    pub fn set_device_sampling(&mut self, on: bool) {
        self.device_sampling = on;
    }

    pub fn last_logits(&self, seq_id: u64) -> Option<Vec<f32>> {
        let j = self.host_rows.iter().position(|&id| id == seq_id)?;
        let n_vocab = self.core.config().n_vocab;
        Some(self.host_logits.as_ref()?[j * n_vocab..(j + 1) * n_vocab].to_vec())
    }

    /// Counters (see [`EngineStats`]).
    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats.clone();
        s.prefix_cache_blocks = self.sched.pool.n_cached() as u64;
        if let Some(d) = &self.draft {
            s.draft_kv_blocks_total = d.kv_blocks_total() as u64;
            s.draft_kv_blocks_free = d.kv_blocks_free() as u64;
        }
        let (total, wait) = self.rank0_collective_seconds();
        s.tp_collective_seconds = total - self.collective_base.0;
        s.tp_collective_wait_seconds = wait - self.collective_base.1;
        s
    }

    fn rank0_collective_seconds(&self) -> (f64, f64) {
        match &self.core {
            Core::One { .. } => (0.0, 0.0),
            Core::Sharded(m) => m.collective_seconds()[0],
        }
    }

    /// Zeroes the counters.
    pub fn reset_stats(&mut self) {
        self.stats = EngineStats::default();
        self.collective_base = self.rank0_collective_seconds();
        self.sched.n_preempted = 0;
        self.sched.prefix_query_tokens = 0;
        self.sched.prefix_hit_tokens = 0;
    }

    fn sync_sched_stats(&mut self) {
        self.stats.preemptions = self.sched.n_preempted;
        self.stats.prefix_cache_query_tokens = self.sched.prefix_query_tokens;
        self.stats.prefix_cache_hit_tokens = self.sched.prefix_hit_tokens;
    }

    /// The scheduler (sequences, block pool).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// The KV cache storage (rank 0's when sharded: its KV heads).
    pub fn kv_cache(&self) -> &B::KvCache {
        match &self.core {
            Core::One { kv, .. } => kv,
            Core::Sharded(m) => m.kv_cache(0),
        }
    }

    /// The whole model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        self.core.config()
    }

    /// The tensor-parallel partition (`None` with one shard).
    pub fn shard_plan(&self) -> Option<&ShardPlan> {
        match &self.core {
            Core::One { .. } => None,
            Core::Sharded(m) => Some(&m.plan),
        }
    }
}

/// Where a verification reads its rows: the backend's argmax and log-probability per row (every
/// sequence plain greedy), or the logits on the host (`[rows · n_vocab]`).
enum VerifyRows<'a> {
    Greedy(&'a [u32], &'a [f32]),
    Host(&'a [f32], usize),
}

/// Appends sampled `token` to `s` and decides the end of its request: a stop id ("stop"),
/// its `max_tokens`-th token or a full context of `n_ctx` ("length").
fn commit_token(s: &mut Sequence, token: u32, n_ctx: usize) -> Option<Finish> {
    s.tokens.push(token);
    s.sampler.accept(token);
    s.n_sampled += 1;
    let p = s.sampler.params();
    if p.stop_ids.contains(&token) {
        Some(Finish::Stop)
    } else if p.max_tokens.is_some_and(|m| s.n_sampled >= m) || s.tokens.len() >= n_ctx {
        Some(Finish::Length)
    } else {
        None
    }
}

/// Verifies the draft of `s` (its logit rows `j0 ..= j0 + draft.len()`: the pending token's, then
/// each draft token's) and appends what it keeps: row `i`'s token is the target's (greedy) or
/// [`Sampler::verify`]'s (sampled) given the tokens before it; the draft token `i` is kept while
/// it equals that, and the first token that differs (or the one after the whole draft) ends the
/// run. The end of the request is decided after each token ([`commit_token`]): a finish ends the
/// run there. Returns the tokens appended, in order (each with its finish), and how many of them
/// were draft tokens. Leaves the draft empty.
fn verify_draft(s: &mut Sequence, j0: usize, rows: &VerifyRows<'_>, n_ctx: usize) -> (Vec<StepOutput>, usize) {
    let mut draft = std::mem::take(&mut s.draft);
    let k = draft.len();
    let mut out = Vec::with_capacity(k + 1);
    let mut accepted = 0;
    for i in 0..=k {
        let j = j0 + i;
        let x = match rows {
            VerifyRows::Greedy(ids, lps) => Sampled { token: ids[j], logprob: lps[j], top_logprobs: None },
            VerifyRows::Host(logits, n_vocab) => {
                let row = &logits[j * n_vocab..(j + 1) * n_vocab];
                if i < k {
                    s.sampler.verify(row, &s.tokens, draft[i])
                } else {
                    s.sampler.sample(row, &s.tokens)
                }
            }
        };
        let finish = commit_token(s, x.token, n_ctx);
        let agreed = i < k && x.token == draft[i];
        accepted += agreed as usize;
        out.push(StepOutput { seq_id: s.id, token: x.token, logprob: x.logprob, top_logprobs: x.top_logprobs, finish });
        if finish.is_some() || !agreed {
            break;
        }
    }
    s.spec.steps += 1;
    s.spec.drafted += k as u64;
    s.spec.accepted += accepted as u64;
    let max_k = s.draft_k;
    s.draft_ctl.update(k, accepted, max_k);
    draft.clear();
    s.draft = draft; // its allocation, for the next draft
    (out, accepted)
}

impl<B: Backend> EngineApi for Engine<B> {
    fn backend_name(&self) -> &'static str {
        self.core.backend().name()
    }
    fn config(&self) -> &ModelConfig {
        self.core.config()
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn kv_blocks_total(&self) -> usize {
        self.sched.pool.n_total()
    }
    fn kv_blocks_free(&self) -> usize {
        self.sched.pool.n_free()
    }
    fn state_memory(&self) -> StateMemory {
        self.state_memory
    }
    fn n_running(&self) -> usize {
        self.sched.n_running()
    }
    fn n_waiting(&self) -> usize {
        self.sched.n_waiting()
    }
    fn request_limits(&self) -> RequestLimits {
        Engine::request_limits(self)
    }
    fn add_sequence(
        &mut self,
        seq_id: u64,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<()> {
        Engine::add_sequence(self, seq_id, prompt, params)
    }
    fn remove_sequence(&mut self, seq_id: u64) -> bool {
        Engine::remove_sequence(self, seq_id)
    }
    fn set_resident_prefix(&mut self, seq_id: u64, n_tokens: usize) -> bool {
        self.sched.set_resident(seq_id, n_tokens)
    }
    fn set_conversation(&mut self, seq_id: u64, conversation: u64) -> bool {
        self.sched.set_conversation(seq_id, conversation)
    }
    fn take_prefix_hits(&mut self) -> Vec<(u64, usize)> {
        self.sched.take_admitted_hits()
    }
    fn step(&mut self) -> Result<Vec<StepOutput>> {
        Engine::step(self)
    }
    fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        Engine::logits(self, tokens)
    }
    fn stats(&self) -> EngineStats {
        Engine::stats(self)
    }
    fn reset_stats(&mut self) {
        Engine::reset_stats(self)
    }
    fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
    fn evict_prefix(&mut self, tokens: &[u32], start: usize) -> Result<usize> {
        Engine::evict_prefix(self, tokens, start)
    }
    fn quarantine_span(&mut self, seq_id: u64, start: usize, end: usize) -> Result<usize> {
        Engine::quarantine_span(self, seq_id, start, end)
    }
    fn last_logits(&self, seq_id: u64) -> Option<Vec<f32>> {
        Engine::last_logits(self, seq_id)
    }
    fn cached_blocks(&self) -> Vec<(u64, Option<u64>, Vec<u32>)> {
        self.sched.pool.cached_blocks()
    }
    fn shard_plan(&self) -> Option<&ShardPlan> {
        Engine::shard_plan(self)
    }
}

#[cfg(test)]
mod pool_tests {
    #[test]
    fn default_pool_is_between_one_and_the_logical_cpus() {
        let n = super::physical_cores();
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!((1..=logical).contains(&n), "{n} of {logical}");
    }
}
