//! Opening an engine on a backend: [`Engine::open_cpu`] (one model, or `N` tensor-parallel
//! shards) and, with the `cuda` feature, `Engine::open_cuda` (GPU 0). Both check the
//! draft-model options before anything loads and attach the draft model on the target's backend.

use std::path::Path;
use std::sync::Arc;

use super::{build_pool, check_draft_options, Core, Engine, EngineOptions, Sizes};
use crate::backend::cpu::CpuBackend;
use crate::gguf::GgufFile;
use crate::model::{Model, ModelConfig};
use crate::parallel::ShardedModel;
use crate::Result;

impl Engine<CpuBackend> {
    /// Opens `path` on the CPU backend; with `opts.tensor_parallel = N > 1`, as `N` shards
    /// ([`ShardedModel::open_cpu`]) whose pools share `opts.threads`.
    ///
    /// Errors: as [`Model::open`] and [`Engine::new`]; [`FakError::Shard`](crate::FakError::Shard)
    /// when the model cannot be split `N` ways.
    pub fn open_cpu(
        path: impl AsRef<Path>,
        opts: EngineOptions,
    ) -> Result<Engine<CpuBackend>> {
        check_draft_options(&opts)?;
        let pool = build_pool(opts.threads)?;
        let path = path.as_ref().to_path_buf();
        if opts.tensor_parallel > 1 {
            let file = Arc::new(GgufFile::open(&path)?);
            let mut cfg = ModelConfig::from_gguf_with(&file, &opts.rope)?;
            if let Some(w) = opts.sliding_window {
                cfg.set_sliding_window(w)?;
            }
            let sizes = Sizes::of(&opts, &cfg)?;
            let threads = pool.current_num_threads();
            let kv = sizes.kv_layout(&cfg);
            let sharded = ShardedModel::open_cpu(file, cfg, opts.tensor_parallel, threads, kv, sizes.limits, sizes.max_logits)?;
            return Engine::with_core(Core::Sharded(sharded), opts, sizes, pool);
        }
        let model = pool.install(|| Model::open_placed(&path, CpuBackend::default(), &opts.rope, opts.n_cpu_moe))?;
        let (draft_path, rope) = (opts.draft_model.clone(), opts.rope.clone());
        let mut engine = Engine::with_pool(model, opts, pool.clone())?;
        if let Some(p) = draft_path {
            let draft = pool.install(|| Model::open_with(&p, CpuBackend::default(), &rope))?;
            engine.attach_draft(draft)?;
        }
        Ok(engine)
    }
}

#[cfg(feature = "cuda")]
impl Engine<crate::backend::cuda::CudaBackend> {
    /// Opens `path` as an engine on GPU 0.
    ///
    /// Errors: as [`CudaBackend::new`](crate::backend::cuda::CudaBackend::new) and
    /// [`Model::open`]; [`FakError::Backend`](crate::FakError::Backend) for `opts.tensor_parallel > 1` (multi-GPU tensor
    /// parallelism is not built).
    pub fn open_cuda(path: impl AsRef<Path>, opts: EngineOptions) -> Result<Self> {
        use crate::backend::cuda::CudaBackend;
        if opts.tensor_parallel > 1 {
            // checked before the model is loaded onto GPU 0
            return Err(super::tensor_parallel_unavailable("cuda", opts.tensor_parallel));
        }
        check_draft_options(&opts)?;
        let backend = CudaBackend::new(0)?;
        let model = Model::open_placed(path, backend, &opts.rope, opts.n_cpu_moe)?;
        let (draft_path, rope) = (opts.draft_model.clone(), opts.rope.clone());
        let mut engine = Engine::new(model, EngineOptions { draft_model: None, ..opts })?;
        if let Some(p) = draft_path {
            // the draft on the same GPU, in a backend of its own (its kernels, streams and scratch)
            let draft = Model::open_with(p, CudaBackend::new(0)?, &rope)?;
            engine.attach_draft(draft)?;
        }
        Ok(engine)
    }
}
