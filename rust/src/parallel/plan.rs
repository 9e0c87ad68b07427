//! The tensor-parallel partition of a decoder into `N` shards (Megatron-LM: Shoeybi et al. 2019,
//! "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism", §3):
//!
//! | weights                         | split                          | what a shard holds              |
//! |---------------------------------|--------------------------------|---------------------------------|
//! | `attn_q` (+bias)                | column (output rows)           | its query heads                 |
//! | `attn_k`, `attn_v` (+biases)    | column (output rows)           | its KV heads (replicated when fewer KV heads than shards) |
//! | `attn_output`                   | row (K, the input features)    | the K range of its query heads  |
//! | `ffn_gate`, `ffn_up`            | column (output rows)           | its FFN columns                 |
//! | `ffn_down`                      | row (K)                        | the K range of its FFN columns  |
//! | `ffn_{gate,up,down}_exps`       | by expert (default)            | its experts, whole              |
//! |                                 | or column (`FAK_TP_MOE=columns`) | its columns of every expert (K of down) |
//! | `ffn_gate_inp` (MoE router)     | replicated                     | everything                      |
//! | `output` (or tied `token_embd`) | column (vocabulary rows)       | its vocabulary slice            |
//! | `token_embd`, norms, `rope_freqs` | replicated                   | everything                      |
//! | `attn_output.bias`              | on rank 0 only (added once)    |                                 |
//!
//! After `attn_output` and after `ffn_down` each shard holds a partial sum of the whole
//! `[n_rows, n_embd]` projection; one sum all-reduce each ([`super::comm`]) gives every shard the
//! same residual. The LM head's vocabulary slices are gathered into one `[n_rows, n_vocab]` row
//! set on rank 0.
//!
//! A mixture-of-experts FFN (`qwen3moe`) is split one of two ways ([`MoeSplit`]); in both, every
//! shard runs the replicated router on the same (bit-identical) input, so all pick the same
//! experts with the same weights, and one all-reduce completes `Σ_s w_s · down_s(swiglu(gate_s,
//! up_s))` before the residual add, as after a dense `ffn_down`:
//!
//! - **by expert** (the default): shard `r` holds experts `[e0, e1)` of `n_expert` whole (their
//!   bytes borrowed from the map) and computes only the chosen (row, expert) pairs among them;
//!   any `N ≤ n_expert` works, the FFN columns are not cut;
//! - **by column** (`FAK_TP_MOE=columns`): shard `r` holds columns `[f0, f1)` of `n_ff_exp` of
//!   every expert (vLLM's `FusedMoE` under tensor parallelism, llama.cpp's `--split-mode row`),
//!   cut on `ffn_down_exps`'s blocks like a dense `ffn_down` (copied): Qwen3-30B-A3B's 768 = 3
//!   Q4_K/Q6_K blocks allows `N ≤ 3`, and `N = 2` is 512 + 256 columns.
//!
//! docs/tensor-parallel.md gives the measurement behind the default.
//!
//! GQA (as vLLM's `QKVParallelLinear` and Megatron): with `N ≤ n_head_kv` the KV heads are divided
//! among the shards and each takes the query heads of its KV heads; with `N > n_head_kv` every
//! shard holds exactly one KV head (replicated on `N / n_head_kv` shards, one more for the first
//! `N mod n_head_kv` heads) and the query heads of that KV head are divided among its shards.
//! Unlike vLLM, fak does not require even splits: the 0.5B's 14 query heads over 2 KV heads at
//! `N = 4` are 4 + 3 + 4 + 3, and its `n_ff = 4864` (19 Q4_K/Q6_K blocks of 256 along `ffn_down`'s
//! K) is 10 + 9 blocks at `N = 2`. A rank's load is then up to one granule larger than another's.
//!
//! Quantized blocks are never cut: output rows are whole rows, so a column split is always
//! possible; a row split (along K) must start and end on a block boundary of the tensor's format
//! (32 elements for Q4_0/Q5_0/Q8_0, 256 for the k-quants). The partition is made of whole
//! granules — query heads in groups whose width is a multiple of `attn_output`'s block, FFN
//! columns in whole `ffn_down` blocks — and when there are fewer granules than shards (or a KV
//! head's first query column is not on a block boundary) the plan fails with
//! [`FakError::Shard`] naming the tensor, its format and `N`. fak never dequantizes to split.

use std::ops::Range;

use crate::gguf::GgufFile;
use crate::model::config::MoeConfig;
use crate::model::ModelConfig;
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// One shard's part of the model, in the whole model's coordinates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    /// 0-based rank; rank 0 adds the row-split projections' biases and receives the logits.
    pub rank: usize,
    /// Query heads `[q0, q1)` of the whole model.
    pub q_heads: Range<usize>,
    /// KV heads `[kv0, kv1)` (several shards hold the same one when `N > n_head_kv`).
    pub kv_heads: Range<usize>,
    /// FFN intermediate columns `[f0, f1)` (rows of `ffn_gate`/`ffn_up`, K of `ffn_down`; of a
    /// MoE model, the same columns of every expert's `n_ff_exp`).
    pub ffn: Range<usize>,
    /// Vocabulary rows `[v0, v1)` of the LM head (columns of the logits).
    pub vocab: Range<usize>,
    /// MoE experts `[e0, e1)` this shard holds whole ([`MoeSplit::Experts`]); `None`: every
    /// expert (split by columns, or a dense model).
    pub experts: Option<Range<usize>>,
}

impl ShardSpec {
    /// Elements `[q0·head_dim, q1·head_dim)`: rows of `attn_q`, K of `attn_output`.
    pub fn q_cols(&self, head_dim: usize) -> Range<usize> {
        self.q_heads.start * head_dim..self.q_heads.end * head_dim
    }

    /// Elements `[kv0·head_dim, kv1·head_dim)`: rows of `attn_k` and `attn_v`.
    pub fn kv_cols(&self, head_dim: usize) -> Range<usize> {
        self.kv_heads.start * head_dim..self.kv_heads.end * head_dim
    }

    /// Whether this shard adds the biases of the row-split projections (`attn_output.bias`):
    /// rank 0 only, so that the sum over shards adds them once.
    pub fn adds_row_bias(&self) -> bool {
        self.rank == 0
    }

    /// The hyper-parameters this shard's forward runs with: `full` with its own head, KV head,
    /// FFN (of a MoE model: each expert's `n_ff_exp`, and the experts it holds) and vocabulary
    /// counts (`n_embd`, `head_dim`, RoPE, the routing over all `n_expert`, ... unchanged).
    pub fn config(&self, full: &ModelConfig) -> ModelConfig {
        ModelConfig {
            n_head: self.q_heads.len(),
            n_head_kv: self.kv_heads.len(),
            n_ff: self.ffn.len(),
            n_vocab: self.vocab.len(),
            moe: full.moe.map(|m| MoeConfig {
                n_ff_exp: self.ffn.len(),
                held: self.experts.as_ref().map_or((0, m.n_expert), |e| (e.start, e.end)),
                ..m
            }),
            ..full.clone()
        }
    }
}

/// The shapes a partition depends on (from [`ModelConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// MoE experts to divide whole among the shards ([`MoeSplit::Experts`]); 0: none (a dense
    /// model, or experts split by columns: then `n_ff` is each expert's `n_ff_exp`).
    pub experts: usize,
}

impl PlanShape {
    /// The shape of `cfg` with its MoE experts (if any) split `split`'s way.
    pub fn of(cfg: &ModelConfig, split: MoeSplit) -> PlanShape {
        let experts = match (cfg.moe, split) {
            (Some(m), MoeSplit::Experts) => m.n_expert,
            _ => 0,
        };
        PlanShape { n_head: cfg.n_head, n_head_kv: cfg.n_head_kv, head_dim: cfg.head_dim, n_ff: cfg.n_ff, n_vocab: cfg.n_vocab, experts }
    }
}

/// How a mixture-of-experts FFN is divided among tensor-parallel shards (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeSplit {
    /// Each shard holds `n_expert / N` experts whole (the default).
    Experts,
    /// Each shard holds `n_ff_exp / N` columns of every expert.
    Columns,
}

impl MoeSplit {
    /// `FAK_TP_MOE`: `experts` (or unset) or `columns`.
    ///
    /// Errors: [`FakError::InvalidArgument`] (`FAK_TP_MOE`) for another value.
    pub fn from_env() -> Result<MoeSplit> {
        match std::env::var("FAK_TP_MOE").as_deref() {
            Err(_) | Ok("" | "experts") => Ok(MoeSplit::Experts),
            Ok("columns") => Ok(MoeSplit::Columns),
            Ok(other) => Err(FakError::invalid("FAK_TP_MOE", format!("{other:?} (experts or columns)"))),
        }
    }
}

/// A row-split (K-split) weight kind's constraint: the tensor whose format has the largest block
/// among the layers (k-quants 256, legacy quants 32, float formats 1), named in errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KBlock {
    pub tensor: String,
    pub format: GgmlType,
}

impl KBlock {
    /// Elements per block of the format.
    pub fn block(&self) -> usize {
        self.format.block_size()
    }
}

/// The row-split FFN projection of `cfg`'s layers: `ffn_down.weight`, or a MoE model's stacked
/// `ffn_down_exps.weight` (its K is `n_ff_exp`, which is `cfg.n_ff` then).
fn down_name(cfg: &ModelConfig) -> &'static str {
    if cfg.moe.is_some() {
        "ffn_down_exps.weight"
    } else {
        "ffn_down.weight"
    }
}

/// The partition of a model into `n_shards` tensor-parallel shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    pub n_shards: usize,
    /// One entry per rank, in rank order.
    pub shards: Vec<ShardSpec>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

/// `total` units in `parts` contiguous ranges covering `0..total`, each made of whole granules of
/// `granule` units (the last range ends at `total`, so a partial last granule is allowed), as even
/// as possible: `G = ceil(total / granule)` granules, the first `G mod parts` ranges one more.
/// `None` when `G < parts` (a range would be empty). `parts` and `granule` must be ≥ 1.
pub fn split_aligned(total: usize, parts: usize, granule: usize) -> Option<Vec<Range<usize>>> {
    debug_assert!(parts >= 1 && granule >= 1);
    let n_gran = total.div_ceil(granule);
    if n_gran < parts {
        return None;
    }
    let (base, extra) = (n_gran / parts, n_gran % parts);
    let mut out = Vec::with_capacity(parts);
    let mut g0 = 0;
    for p in 0..parts {
        let g1 = g0 + base + usize::from(p < extra);
        out.push((g0 * granule).min(total)..(g1 * granule).min(total));
        g0 = g1;
    }
    Some(out)
}

impl ShardPlan {
    /// The partition of `shape` into `n` shards, under the K-block constraints of
    /// `attn_output` (`wo`) and `ffn_down` (`down`; unused when `shape.experts > 0`: the experts
    /// are divided instead of the columns). `n = 1` is the whole model.
    ///
    /// Errors: [`FakError::InvalidArgument`] (`tensor_parallel`) for `n = 0`; [`FakError::Shard`]
    /// naming `wo.tensor` when the query heads cannot be divided into `n` block-aligned K ranges
    /// of `attn_output` (`n > n_head`, or fewer aligned head groups than shards, or a KV head's
    /// query heads not starting on a block), naming `down.tensor` when `n_ff` has fewer whole
    /// `ffn_down` blocks than shards (or fewer experts than shards), and naming `output.weight`
    /// when `n > n_vocab`.
    pub fn new(shape: &PlanShape, n: usize, wo: &KBlock, down: &KBlock) -> Result<ShardPlan> {
        if n == 0 {
            return Err(FakError::invalid("tensor_parallel", "0 (must be ≥ 1)"));
        }
        let PlanShape { n_head, n_head_kv, head_dim, n_ff, n_vocab, experts } = *shape;
        let g = n_head / n_head_kv;
        let bs_wo = wo.block();
        let wo_err = |msg: String| FakError::shard(&wo.tensor, wo.format.name(), n, msg);
        if n > n_head {
            return Err(wo_err(format!("the model has {n_head} query heads, so at most {n_head} shards")));
        }
        // (query heads, KV heads) of each rank.
        let mut heads: Vec<(Range<usize>, Range<usize>)> = Vec::with_capacity(n);
        if n <= n_head_kv {
            // KV heads divided; a group of `kg` KV heads spans a whole number of attn_output blocks.
            let kg = lcm(g * head_dim, bs_wo) / (g * head_dim);
            let parts = split_aligned(n_head_kv, n, kg).ok_or_else(|| {
                wo_err(format!(
                    "its K = {} ({n_head} heads × {head_dim}) can only be cut every {} heads ({bs_wo}-element blocks, whole KV groups of {g}): {} pieces for {n} shards",
                    n_head * head_dim, kg * g, n_head_kv.div_ceil(kg)
                ))
            })?;
            heads.extend(parts.into_iter().map(|kv| (kv.start * g..kv.end * g, kv)));
        } else {
            // One KV head per shard, replicated; its query heads divided among its shards.
            let qg = lcm(head_dim, bs_wo) / head_dim;
            for kv in 0..n_head_kv {
                let r = n / n_head_kv + usize::from(kv < n % n_head_kv);
                let q0 = kv * g;
                if (q0 * head_dim) % bs_wo != 0 {
                    return Err(wo_err(format!(
                        "KV head {kv}'s query heads start at K = {} ({q0} heads × {head_dim}), inside a {bs_wo}-element block",
                        q0 * head_dim
                    )));
                }
                let parts = split_aligned(g, r, qg).ok_or_else(|| {
                    wo_err(format!(
                        "{n} shards over {n_head_kv} KV heads put {r} shards on KV head {kv}, whose {g} query heads can only be cut every {qg} heads ({bs_wo}-element blocks of K)"
                    ))
                })?;
                heads.extend(parts.into_iter().map(|q| (q0 + q.start..q0 + q.end, kv..kv + 1)));
            }
        }
        let bs_down = down.block();
        // a MoE model's K is each expert's n_ff_exp (PlanShape::n_ff holds it then)
        let k_name = if down.tensor.contains("_exps") { "n_ff_exp" } else { "n_ff" };
        let expert_ranges = match experts {
            0 => vec![None; n],
            _ => split_aligned(experts, n, 1)
                .ok_or_else(|| FakError::shard(&down.tensor, down.format.name(), n, format!("the model has {experts} experts per layer")))?
                .into_iter()
                .map(Some)
                .collect(),
        };
        let ffn = if experts > 0 { Some(vec![0..n_ff; n]) } else { split_aligned(n_ff, n, bs_down) };
        let ffn = ffn.ok_or_else(|| {
            FakError::shard(
                &down.tensor,
                down.format.name(),
                n,
                format!("its K = {k_name} {n_ff} can only be cut on {bs_down}-element blocks: {} blocks for {n} shards", n_ff.div_ceil(bs_down)),
            )
        })?;
        let vocab = split_aligned(n_vocab, n, 1)
            .ok_or_else(|| FakError::shard("output.weight", "-", n, format!("the vocabulary has {n_vocab} rows")))?;
        let shards = heads
            .into_iter()
            .zip(ffn)
            .zip(vocab)
            .zip(expert_ranges)
            .enumerate()
            .map(|(rank, ((((q_heads, kv_heads), ffn), vocab), experts))| ShardSpec { rank, q_heads, kv_heads, ffn, vocab, experts })
            .collect();
        Ok(ShardPlan { n_shards: n, shards })
    }

    /// The partition of the model `cfg` read from `file` into `n` shards: [`Self::new`] with the
    /// largest block of the file's `attn_output` and `ffn_down` (of a MoE model `ffn_down_exps`)
    /// tensors and a MoE model's experts split [`MoeSplit::from_env`]'s way, then
    /// [`Self::validate`] against every one of them.
    ///
    /// Errors: as [`Self::new`], [`MoeSplit::from_env`] and [`Self::validate`]; [`FakError::Model`]
    /// for a missing tensor.
    pub fn for_model(cfg: &ModelConfig, file: &GgufFile, n: usize) -> Result<ShardPlan> {
        let type_of = |name: &str| file.tensor(name).map(|t| t.ggml_type);
        let widest = |suffix: &str| -> Result<KBlock> {
            let mut best: Option<KBlock> = None;
            for il in 0..cfg.n_layer {
                let name = format!("blk.{il}.{suffix}");
                let t = type_of(&name).ok_or_else(|| FakError::model(format!("missing tensor {name}")))?;
                if best.as_ref().is_none_or(|b| t.block_size() > b.block()) {
                    best = Some(KBlock { tensor: name, format: t });
                }
            }
            best.ok_or_else(|| FakError::model("a model without layers"))
        };
        let split = if cfg.moe.is_some() { MoeSplit::from_env()? } else { MoeSplit::Columns };
        let plan = ShardPlan::new(&PlanShape::of(cfg, split), n, &widest("attn_output.weight")?, &widest(down_name(cfg))?)?;
        plan.validate(cfg, type_of)?;
        Ok(plan)
    }

    /// Checks that every row-split tensor (`blk.*.attn_output.weight`, `blk.*.ffn_down.weight`
    /// or `blk.*.ffn_down_exps.weight`) is cut only on block boundaries of its own format
    /// (`type_of` gives a tensor's format).
    ///
    /// Errors: [`FakError::Shard`] naming the first tensor cut inside a block.
    pub fn validate(&self, cfg: &ModelConfig, type_of: impl Fn(&str) -> Option<GgmlType>) -> Result<()> {
        for il in 0..cfg.n_layer {
            for (suffix, ranges) in [
                ("attn_output.weight", self.shards.iter().map(|s| s.q_cols(cfg.head_dim)).collect::<Vec<_>>()),
                (down_name(cfg), self.shards.iter().map(|s| s.ffn.clone()).collect()),
            ] {
                let name = format!("blk.{il}.{suffix}");
                let Some(t) = type_of(&name) else { continue };
                let bs = t.block_size();
                let k = if suffix.starts_with("attn") { cfg.q_dim() } else { cfg.n_ff };
                if let Some(r) = ranges.iter().find(|r| r.start % bs != 0 || (r.end != k && r.end % bs != 0)) {
                    return Err(FakError::shard(
                        name,
                        t.name(),
                        self.n_shards,
                        format!("K range {}..{} of {k} does not fall on {bs}-element blocks", r.start, r.end),
                    ));
                }
            }
        }
        Ok(())
    }

    /// One line per shard: `rank r: q heads a..b, KV heads c..d, FFN e..f, vocab g..h` (and
    /// `, experts i..j` when the MoE experts are divided).
    pub fn describe(&self) -> String {
        self.shards
            .iter()
            .map(|s| {
                let experts = s.experts.as_ref().map_or(String::new(), |e| format!(", experts {e:?}"));
                format!(
                    "rank {}: q heads {:?}, KV heads {:?}, FFN {:?}, vocab {:?}{experts}",
                    s.rank, s.q_heads, s.kv_heads, s.ffn, s.vocab
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kb(t: GgmlType) -> KBlock {
        KBlock { tensor: format!("blk.0.x.weight ({})", t.name()), format: t }
    }

    /// Qwen2.5-Coder-0.5B: 14 query heads over 2 KV heads of 64, n_ff 4864, vocab 151936;
    /// attn_output Q5_0, ffn_down Q4_K/Q6_K (256-element blocks).
    const QWEN05: PlanShape = PlanShape { n_head: 14, n_head_kv: 2, head_dim: 64, n_ff: 4864, n_vocab: 151936, experts: 0 };
    /// Qwen2.5-Coder-1.5B: 12 query heads over 2 KV heads of 128, n_ff 8960; all Q4_K/Q6_K.
    const QWEN15: PlanShape = PlanShape { n_head: 12, n_head_kv: 2, head_dim: 128, n_ff: 8960, n_vocab: 151936, experts: 0 };

    fn check_cover(p: &ShardPlan, s: &PlanShape) {
        // contiguous cover of query heads, FFN and vocabulary; every shard non-empty
        let mut q = 0;
        let mut f = 0;
        let mut v = 0;
        for (r, sh) in p.shards.iter().enumerate() {
            assert_eq!(sh.rank, r);
            assert_eq!(sh.q_heads.start, q);
            assert_eq!(sh.ffn.start, f);
            assert_eq!(sh.vocab.start, v);
            assert!(!sh.q_heads.is_empty() && !sh.kv_heads.is_empty() && !sh.ffn.is_empty() && !sh.vocab.is_empty());
            // each local query head maps onto a local KV head, uniformly (the backend's GQA)
            let g = s.n_head / s.n_head_kv;
            assert_eq!(sh.q_heads.len() % sh.kv_heads.len(), 0, "{sh:?}");
            let lg = sh.q_heads.len() / sh.kv_heads.len();
            for (i, h) in sh.q_heads.clone().enumerate() {
                assert_eq!(h / g, sh.kv_heads.start + i / lg, "rank {r} head {h}");
            }
            q = sh.q_heads.end;
            f = sh.ffn.end;
            v = sh.vocab.end;
        }
        assert_eq!((q, f, v), (s.n_head, s.n_ff, s.n_vocab));
    }

    #[test]
    fn split_aligned_is_even_in_whole_granules() {
        assert_eq!(split_aligned(4864, 2, 256).unwrap(), vec![0..2560, 2560..4864]);
        assert_eq!(split_aligned(4864, 4, 256).unwrap(), vec![0..1280, 1280..2560, 2560..3840, 3840..4864]);
        assert_eq!(split_aligned(7, 2, 1).unwrap(), vec![0..4, 4..7]);
        // a partial last granule stays with the last range
        assert_eq!(split_aligned(10, 3, 4).unwrap(), vec![0..4, 4..8, 8..10]);
        assert_eq!(split_aligned(512, 3, 256), None);
        assert_eq!(split_aligned(5, 5, 1).unwrap().len(), 5);
    }

    #[test]
    fn qwen05_two_shards_divide_the_kv_heads() {
        let p = ShardPlan::new(&QWEN05, 2, &kb(GgmlType::Q5_0), &kb(GgmlType::Q6_K)).unwrap();
        check_cover(&p, &QWEN05);
        assert_eq!(p.shards[0].q_heads, 0..7);
        assert_eq!(p.shards[0].kv_heads, 0..1);
        assert_eq!(p.shards[1].q_heads, 7..14);
        assert_eq!(p.shards[1].kv_heads, 1..2);
        assert_eq!(p.shards[0].ffn, 0..2560); // 10 of 19 Q6_K blocks
        assert_eq!(p.shards[1].ffn, 2560..4864);
        assert_eq!(p.shards[1].vocab, 75968..151936);
        assert_eq!(p.shards[1].q_cols(64), 448..896);
    }

    #[test]
    fn qwen05_four_shards_replicate_kv_heads_and_split_query_heads_unevenly() {
        let p = ShardPlan::new(&QWEN05, 4, &kb(GgmlType::Q5_0), &kb(GgmlType::Q4_K)).unwrap();
        check_cover(&p, &QWEN05);
        let q: Vec<_> = p.shards.iter().map(|s| s.q_heads.clone()).collect();
        let kv: Vec<_> = p.shards.iter().map(|s| s.kv_heads.clone()).collect();
        assert_eq!(q, vec![0..4, 4..7, 7..11, 11..14]);
        assert_eq!(kv, vec![0..1, 0..1, 1..2, 1..2]);
        let cfg_heads: Vec<_> = p.shards.iter().map(|s| (s.q_heads.len(), s.kv_heads.len())).collect();
        assert_eq!(cfg_heads, vec![(4, 1), (3, 1), (4, 1), (3, 1)]);
    }

    #[test]
    fn odd_shard_counts_replicate_kv_heads_unevenly() {
        let p = ShardPlan::new(&QWEN05, 3, &kb(GgmlType::Q8_0), &kb(GgmlType::Q8_0)).unwrap();
        check_cover(&p, &QWEN05);
        let q: Vec<_> = p.shards.iter().map(|s| s.q_heads.clone()).collect();
        assert_eq!(q, vec![0..4, 4..7, 7..14]);
        let p = ShardPlan::new(&QWEN05, 14, &kb(GgmlType::Q8_0), &kb(GgmlType::Q8_0)).unwrap();
        check_cover(&p, &QWEN05);
        assert!(p.shards.iter().all(|s| s.q_heads.len() == 1));
    }

    #[test]
    fn more_shards_than_query_heads_is_a_shard_error() {
        let e = ShardPlan::new(&QWEN05, 15, &kb(GgmlType::Q5_0), &kb(GgmlType::Q4_K)).unwrap_err();
        assert!(matches!(&e, FakError::Shard { n_shards: 15, .. }), "{e}");
    }

    #[test]
    fn zero_shards_is_an_invalid_argument() {
        let e = ShardPlan::new(&QWEN05, 0, &kb(GgmlType::Q5_0), &kb(GgmlType::Q4_K)).unwrap_err();
        assert!(matches!(e, FakError::InvalidArgument { .. }));
    }

    #[test]
    fn qwen15_k_quant_attn_output_cuts_on_256_element_blocks() {
        // 2 shards: 6 heads × 128 = 768 = 3 Q4_K blocks each.
        let p = ShardPlan::new(&QWEN15, 2, &kb(GgmlType::Q4_K), &kb(GgmlType::Q6_K)).unwrap();
        check_cover(&p, &QWEN15);
        assert_eq!(p.shards[1].q_cols(128), 768..1536);
        assert_eq!(p.shards[0].ffn, 0..4608); // 18 of 35 blocks
        // 4 shards: each KV head's 6 query heads cut every 2 heads (256 elements): 4 + 2, not 3 + 3.
        let p = ShardPlan::new(&QWEN15, 4, &kb(GgmlType::Q4_K), &kb(GgmlType::Q6_K)).unwrap();
        check_cover(&p, &QWEN15);
        let q: Vec<_> = p.shards.iter().map(|s| s.q_heads.clone()).collect();
        assert_eq!(q, vec![0..4, 4..6, 6..10, 10..12]);
        for s in &p.shards {
            let k = s.q_cols(128);
            assert_eq!((k.start % 256, k.end % 256), (0, 0), "{s:?}");
        }
    }

    #[test]
    fn k_quant_blocks_that_cannot_be_cut_name_the_tensor_format_and_n() {
        // attn_output Q4_K with K = 256 (4 heads of 64, one KV head each): one block, no cut.
        let tiny = PlanShape { n_head: 4, n_head_kv: 4, head_dim: 64, n_ff: 512, n_vocab: 1000, experts: 0 };
        let wo = KBlock { tensor: "blk.0.attn_output.weight".into(), format: GgmlType::Q4_K };
        let down = KBlock { tensor: "blk.1.ffn_down.weight".into(), format: GgmlType::Q6_K };
        let e = ShardPlan::new(&tiny, 2, &wo, &down).unwrap_err();
        match &e {
            FakError::Shard { tensor, format, n_shards, .. } => {
                assert_eq!((tensor.as_str(), format.as_str(), *n_shards), ("blk.0.attn_output.weight", "Q4_K", 2));
            }
            other => panic!("{other}"),
        }
        // ffn_down Q6_K with n_ff 512: two blocks, so 2 shards work and 4 do not.
        let wo8 = KBlock { tensor: "blk.0.attn_output.weight".into(), format: GgmlType::Q8_0 };
        ShardPlan::new(&tiny, 2, &wo8, &down).unwrap();
        let e = ShardPlan::new(&tiny, 4, &wo8, &down).unwrap_err();
        match &e {
            FakError::Shard { tensor, format, n_shards, msg } => {
                assert_eq!((tensor.as_str(), format.as_str(), *n_shards), ("blk.1.ffn_down.weight", "Q6_K", 4));
                assert!(msg.contains("2 blocks for 4 shards"), "{msg}");
            }
            other => panic!("{other}"),
        }
        let s = e.to_string();
        assert!(s.contains("blk.1.ffn_down.weight") && s.contains("Q6_K") && s.contains("4 tensor-parallel shards"), "{s}");
    }

    #[test]
    fn replicated_kv_head_whose_query_heads_start_inside_a_block_is_refused() {
        // 0.5B geometry with a k-quant attn_output: KV head 1's heads start at K = 448.
        let e = ShardPlan::new(&QWEN05, 4, &kb(GgmlType::Q4_K), &kb(GgmlType::Q4_K)).unwrap_err();
        assert!(e.to_string().contains("K = 448"), "{e}");
    }

    #[test]
    fn which_shard_counts_the_real_layouts_support() {
        let ok = |s: &PlanShape, wo: GgmlType, down: GgmlType| -> Vec<usize> {
            (1..=s.n_head).filter(|&n| ShardPlan::new(s, n, &kb(wo), &kb(down)).is_ok()).collect()
        };
        // 0.5B: attn_output Q5_0 (32-element blocks, head_dim 64): any N up to its 14 heads.
        assert_eq!(ok(&QWEN05, GgmlType::Q5_0, GgmlType::Q6_K), (1..=14).collect::<Vec<_>>());
        // 1.5B Q4_K_M: 6 query heads of 128 per KV head, cut every 2 heads: at most 3 shards a KV head.
        assert_eq!(ok(&QWEN15, GgmlType::Q4_K, GgmlType::Q6_K), vec![1, 2, 3, 4, 5, 6]);
        // 7B Q4_K_M: 7 query heads of 128 per KV head = 896 = 3.5 Q4_K blocks, so a KV group never
        // ends on a block boundary except every second one: N = 1 or 2.
        let q7 = PlanShape { n_head: 28, n_head_kv: 4, head_dim: 128, n_ff: 18944, n_vocab: 152064, experts: 0 };
        assert_eq!(ok(&q7, GgmlType::Q4_K, GgmlType::Q6_K), vec![1, 2]);
    }

    #[test]
    fn qwen3_layouts_and_the_two_moe_splits() {
        let ok = |s: &PlanShape, wo: GgmlType, down: GgmlType| -> Vec<usize> {
            (1..=s.n_head).filter(|&n| ShardPlan::new(s, n, &kb(wo), &kb(down)).is_ok()).collect()
        };
        // Qwen3-8B Q4_K_M: 32 query heads of 128 over 8 KV heads, n_ff 12288 (48 blocks).
        let q8b = PlanShape { n_head: 32, n_head_kv: 8, head_dim: 128, n_ff: 12288, n_vocab: 151936, experts: 0 };
        assert_eq!(ok(&q8b, GgmlType::Q4_K, GgmlType::Q6_K), (1..=16).collect::<Vec<_>>());
        // Qwen3-Coder-30B-A3B Q4_K_M: 32 heads of 128 over 4 KV heads; the experts' n_ff_exp 768 is
        // 3 blocks of ffn_down_exps (Q4_K / Q6_K), so at most 3 shards, and 2 are 512 + 256 columns.
        let a3b = PlanShape { n_head: 32, n_head_kv: 4, head_dim: 128, n_ff: 768, n_vocab: 151936, experts: 0 };
        assert_eq!(ok(&a3b, GgmlType::Q4_K, GgmlType::Q6_K), vec![1, 2, 3]);
        let p = ShardPlan::new(&a3b, 2, &kb(GgmlType::Q4_K), &kb(GgmlType::Q6_K)).unwrap();
        check_cover(&p, &a3b);
        assert_eq!((p.shards[0].ffn.clone(), p.shards[1].ffn.clone()), (0..512, 512..768));
        let e = ShardPlan::new(&a3b, 4, &kb(GgmlType::Q4_K), &KBlock { tensor: "blk.0.ffn_down_exps.weight".into(), format: GgmlType::Q6_K })
            .unwrap_err();
        assert!(e.to_string().contains("n_ff_exp 768") && e.to_string().contains("3 blocks for 4 shards"), "{e}");
        // Divided by expert, its 128 experts go whole to the shards and the columns are not cut: the
        // heads are the limit (N = 16 leaves 2 query heads of 128 per shard, one Q4_K block).
        let by_expert = PlanShape { experts: 128, ..a3b };
        assert_eq!(ok(&by_expert, GgmlType::Q4_K, GgmlType::Q6_K), (1..=16).collect::<Vec<_>>());
        let p = ShardPlan::new(&by_expert, 3, &kb(GgmlType::Q4_K), &kb(GgmlType::Q6_K)).unwrap();
        check_cover_experts(&p, 128);
        assert!(p.shards.iter().all(|s| s.ffn == (0..768)));
        let e: Vec<_> = p.shards.iter().map(|s| s.experts.clone().unwrap()).collect();
        assert_eq!(e, vec![0..43, 43..86, 86..128]);
        assert!(p.describe().contains("experts 43..86"), "{}", p.describe());
        let few = PlanShape { experts: 2, ..by_expert };
        let e = ShardPlan::new(&few, 3, &kb(GgmlType::Q4_K), &KBlock { tensor: "blk.0.ffn_down_exps.weight".into(), format: GgmlType::Q6_K })
            .unwrap_err();
        assert!(e.to_string().contains("2 experts per layer"), "{e}");
    }

    fn check_cover_experts(p: &ShardPlan, n_expert: usize) {
        let mut e0 = 0;
        for s in &p.shards {
            let e = s.experts.clone().expect("experts divided");
            assert!(e.start == e0 && !e.is_empty(), "{s:?}");
            e0 = e.end;
        }
        assert_eq!(e0, n_expert);
    }

    #[test]
    fn a_moe_shard_runs_its_experts_or_its_columns_of_every_expert_with_the_whole_routing() {
        use crate::model::config::Arch;
        use crate::model::{RopeScaling, RopeScalingKind};
        let moe = MoeConfig { n_expert: 128, n_expert_used: 8, n_ff_exp: 768, norm_w: true, w_scale: 0.0, held: (0, 128), n_ff_shexp: 0 };
        let full = ModelConfig {
            arch: Arch::Qwen3Moe,
            n_layer: 2,
            n_embd: 2048,
            n_ff: 768,
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            n_vocab: 151936,
            n_ctx_train: 4096,
            rms_eps: 1e-6,
            rope: crate::backend::RopeParams::plain(crate::backend::RopeStyle::Neox, 128, 1e7),
            rope_scaling: RopeScaling { kind: RopeScalingKind::None, factor: 1.0, orig_ctx: 4096, freq_factors: None },
            sliding_window: 0,
            swa_pattern: vec![false; 2],
            moe: Some(moe),
            hybrid: None,
        };
        let spec = ShardSpec { rank: 1, q_heads: 16..32, kv_heads: 2..4, ffn: 512..768, vocab: 75968..151936, experts: None };
        let c = spec.config(&full);
        assert_eq!((c.n_head, c.n_head_kv, c.n_ff, c.n_vocab), (16, 2, 256, 75968));
        assert_eq!(c.moe, Some(MoeConfig { n_ff_exp: 256, ..moe }));
        let spec = ShardSpec { ffn: 0..768, experts: Some(64..128), ..spec };
        let c = spec.config(&full);
        assert_eq!(c.moe, Some(MoeConfig { held: (64, 128), ..moe }));
        assert_eq!(PlanShape::of(&full, MoeSplit::Experts).experts, 128);
        assert_eq!(PlanShape::of(&full, MoeSplit::Columns).experts, 0);
    }

    #[test]
    fn one_shard_is_the_whole_model() {
        let p = ShardPlan::new(&QWEN05, 1, &kb(GgmlType::Q5_0), &kb(GgmlType::Q4_K)).unwrap();
        assert_eq!(p.shards, vec![ShardSpec { rank: 0, q_heads: 0..14, kv_heads: 0..2, ffn: 0..4864, vocab: 0..151936, experts: None }]);
    }
}
