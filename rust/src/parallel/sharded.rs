//! A model split into tensor-parallel shards that run one forward together: each shard is a
//! [`Model`] over its slice of the weights ([`Weights::load_shard`]) with its own KV cache (its
//! KV heads, for the same block ids as every other shard: the engine's one block table), its own
//! activation buffers, its own rayon pool, and one rank of a [`Communicator`] group.
//!
//! [`ShardedModel::forward`] runs rank 0 on the calling thread and every other rank on a thread
//! of its own (scoped, per forward), each inside its pool; they meet in the collectives of
//! [`Model::forward_tp`]. Rank 0 ends with the gathered logits. A rank that fails aborts the
//! group, so that no rank waits forever; the group is recovered once all ranks returned, and the
//! error of the rank that failed first is returned.

use std::sync::Arc;

use super::comm::{Communicator, LocalComm};
use super::plan::ShardPlan;
use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BatchLimits, BatchPlan, KvLayout};
use crate::gguf::GgufFile;
use crate::model::forward::TensorParallel;
use crate::model::{Model, ModelConfig, Scratch, Weights};
use crate::{FakError, Result};

struct Shard<B: Backend> {
    model: Model<B>,
    kv: B::KvCache,
    scratch: Scratch<B>,
    comm: Box<dyn Communicator<B>>,
    pool: Arc<rayon::ThreadPool>,
}

/// Aborts the group when dropped armed: a shard that panics mid-forward must not leave the
/// others waiting in a collective.
struct AbortOnUnwind<'a, B: Backend>(&'a dyn Communicator<B>, bool);

impl<B: Backend> Drop for AbortOnUnwind<'_, B> {
    fn drop(&mut self) {
        if self.1 {
            self.0.abort();
        }
    }
}

impl<B: Backend> Shard<B> {
    fn run(&mut self, plan: &BatchPlan, logits: Option<&mut B::Buffer>) -> Result<usize> {
        let Shard { model, kv, scratch, comm, pool } = self;
        let comm: &dyn Communicator<B> = &**comm;
        let mut guard = AbortOnUnwind(comm, true);
        let r = pool.install(|| model.forward_tp(kv, scratch, plan, Some(TensorParallel { comm, logits })));
        guard.1 = false;
        if r.is_err() {
            comm.abort();
        }
        r
    }
}

/// Whether `e` is the error a rank gets when another rank aborted the group (not the cause).
fn is_abort(e: &FakError) -> bool {
    matches!(e, FakError::Backend { backend, .. } if backend == "tensor-parallel")
}

/// A model whose forward runs as `plan.n_shards` tensor-parallel shards.
pub struct ShardedModel<B: Backend> {
    /// The whole model's hyper-parameters.
    pub config: ModelConfig,
    /// Which heads, FFN columns and vocabulary rows each rank holds.
    pub plan: ShardPlan,
    shards: Vec<Shard<B>>,
    /// `[max_logits, n_vocab]`: the gathered logits of the last forward, on rank 0's backend.
    logits: B::Buffer,
}

impl<B: Backend> ShardedModel<B> {
    /// Loads every shard of `plan` from `file`: rank `r` on `backends[r]` with `comms[r]` and
    /// `pools[r]` (`comms` a group of `plan.n_shards` ranks in rank order), with a KV cache of
    /// `kv.n_blocks` blocks of its own KV heads and buffers for batches up to `limits` /
    /// `max_logits` logit rows. `config` is the whole model's.
    ///
    /// Errors: [`FakError::InvalidArgument`] when the vectors do not have one entry per rank;
    /// as [`Weights::load_shard`] and the backends' allocations.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        file: Arc<GgufFile>,
        config: ModelConfig,
        plan: ShardPlan,
        backends: Vec<B>,
        comms: Vec<Box<dyn Communicator<B>>>,
        pools: Vec<Arc<rayon::ThreadPool>>,
        kv: KvLayout,
        limits: BatchLimits,
        max_logits: usize,
    ) -> Result<ShardedModel<B>> {
        let n = plan.n_shards;
        if backends.len() != n || comms.len() != n || pools.len() != n || plan.shards.len() != n {
            return Err(FakError::invalid("tensor_parallel", format!("{n} shards need one backend, communicator and pool each")));
        }
        if comms.iter().enumerate().any(|(r, c)| c.rank() != r || c.size() != n) {
            return Err(FakError::invalid("tensor_parallel", "communicators must be the ranks of one group, in rank order"));
        }
        let mut shards = Vec::with_capacity(n);
        for (((spec, backend), comm), pool) in plan.shards.iter().zip(backends).zip(comms).zip(pools) {
            let weights = pool.install(|| Weights::load_shard(&file, &config, &backend, Some(spec), n))?;
            let model = Model { config: spec.config(&config), backend, weights, file: file.clone() };
            let layout = KvLayout { n_head_kv: spec.kv_heads.len(), ..kv };
            let kv = model.backend.alloc_kv_cache(layout)?;
            let scratch = Scratch::new(&model, limits, max_logits)?;
            shards.push(Shard { model, kv, scratch, comm, pool });
        }
        let logits = shards[0].model.backend.alloc_buffer(max_logits * config.n_vocab)?;
        Ok(ShardedModel { config, plan, shards, logits })
    }

    /// Runs one forward over `plan` on every shard at once (see the module doc); afterwards
    /// [`Self::logits`] holds the `[n_logits, n_vocab]` logits of `plan.logit_rows`. Returns
    /// `n_logits`.
    ///
    /// Errors: as [`Model::forward`] (the first failing rank's error); a panicking rank is a
    /// [`FakError::Backend`].
    pub fn forward(&mut self, plan: &BatchPlan) -> Result<usize> {
        let (first, rest) = self.shards.split_first_mut().expect("at least one shard");
        let logits = &mut self.logits;
        let results: Vec<Result<usize>> = std::thread::scope(|sc| {
            let handles: Vec<_> = rest
                .iter_mut()
                .enumerate()
                .map(|(i, sh)| {
                    std::thread::Builder::new()
                        .name(format!("fak-tp-{}", i + 1))
                        .spawn_scoped(sc, move || sh.run(plan, None))
                })
                .collect();
            if handles.iter().any(|h| h.is_err()) {
                // a rank that never starts would leave the others waiting in the first collective
                first.comm.abort();
            }
            // Rank 0 runs here; its panic (its guard has aborted the group, so the other ranks
            // leave their collectives) becomes an error as theirs do, and the group is recovered
            // below instead of staying aborted for every later forward.
            let r0 = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| first.run(plan, Some(logits))));
            let mut out = vec![r0.unwrap_or_else(|_| {
                Err(FakError::Backend { backend: "cpu".into(), msg: "tensor-parallel shard 0 panicked".into() })
            })];
            for (i, h) in handles.into_iter().enumerate() {
                out.push(match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(FakError::Backend { backend: "cpu".into(), msg: format!("tensor-parallel shard {} panicked", i + 1) })
                    }),
                    Err(e) => Err(FakError::Backend { backend: "cpu".into(), msg: format!("cannot start the thread of shard {}: {e}", i + 1) }),
                });
            }
            out
        });
        if results.iter().all(|r| r.is_ok()) {
            return results.into_iter().next().expect("rank 0");
        }
        for s in &self.shards {
            s.comm.recover();
        }
        let mut errs: Vec<FakError> = results.into_iter().filter_map(|r| r.err()).collect();
        let first_real = errs.iter().position(|e| !is_abort(e)).unwrap_or(0);
        Err(errs.swap_remove(first_real))
    }

    /// The gathered logits of the last forward (`[n_logits, n_vocab]` of rank 0's backend).
    pub fn logits(&self) -> &B::Buffer {
        &self.logits
    }

    /// Rank 0's backend (where [`Self::logits`] lives) and the logits, mutable (device sampling
    /// penalizes them in place).
    pub fn backend_logits_mut(&mut self) -> (&B, &mut B::Buffer) {
        (&self.shards[0].model.backend, &mut self.logits)
    }

    /// Rank 0's backend.
    pub fn backend(&self) -> &B {
        &self.shards[0].model.backend
    }

    /// `(total, waiting)` seconds each rank spent in collectives since creation
    /// ([`Communicator::seconds`]), in rank order.
    pub fn collective_seconds(&self) -> Vec<(f64, f64)> {
        self.shards.iter().map(|s| s.comm.seconds()).collect()
    }

    /// Rank `r`'s KV cache.
    pub fn kv_cache(&self, r: usize) -> &B::KvCache {
        &self.shards[r].kv
    }

    /// Rank `r`'s model (its config and weights).
    pub fn shard_model(&self, r: usize) -> &Model<B> {
        &self.shards[r].model
    }
}

impl ShardedModel<CpuBackend> {
    /// `file` as `n` shards on the CPU backend with in-process communicators ([`LocalComm`]):
    /// `config` is the whole model's (read from `file`, with the caller's RoPE scaling and sliding
    /// window applied), the plan that of [`ShardPlan::for_model`], and `threads` worker threads divided among the
    /// shards' pools (`threads / n` each, the first `threads mod n` one more, at least one).
    ///
    /// Errors: as [`ShardPlan::for_model`] and [`Self::new`]; [`FakError::Backend`] when a
    /// thread pool cannot start.
    #[allow(clippy::too_many_arguments)]
    pub fn open_cpu(
        file: Arc<GgufFile>,
        config: ModelConfig,
        n: usize,
        threads: usize,
        kv: KvLayout,
        limits: BatchLimits,
        max_logits: usize,
    ) -> Result<ShardedModel<CpuBackend>> {
        let plan = ShardPlan::for_model(&config, &file, n)?;
        let comms = LocalComm::group(n)?.into_iter().map(|c| Box::new(c) as Box<dyn Communicator<CpuBackend>>).collect();
        let pools = (0..n)
            .map(|r| {
                let t = (threads / n + usize::from(r < threads % n)).max(1);
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .thread_name(move |i| format!("fak-tp{r}-{i}"))
                    .build()
                    .map(Arc::new)
                    .map_err(|e| FakError::Backend { backend: "cpu".into(), msg: format!("thread pool of shard {r}: {e}") })
            })
            .collect::<Result<Vec<_>>>()?;
        let backends = (0..n).map(|_| CpuBackend::default()).collect();
        ShardedModel::new(file, config, plan, backends, comms, pools, kv, limits, max_logits)
    }

    /// Threads of each shard's pool, in rank order.
    pub fn threads(&self) -> Vec<usize> {
        self.shards.iter().map(|s| s.pool.current_num_threads()).collect()
    }
}
