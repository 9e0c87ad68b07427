//! Which quantized-matmul kernel runs a `(format, rows, k, n_out)` product, and with what launch
//! shape: the decode GEMV (`mmvq_*`, up to 8 activation rows per launch, more rows in chunks of
//! 8) or the int8 tensor-core GEMM (`mmq_<fmt>_q8_n<BN>_p<G>`, `BN` tokens per tile, `G` k-steps
//! per barrier, the K range split over `splits` blocks per tile; or its staged mode
//! `mmq_<fmt>_q8_n<BN>_s<S>`, S stages of 256 values of K copied ahead by cp.async, and its
//! fragment mode `mmq_<fmt>_q8_n<BN>_f<S>` for Q4_K/Q6_K, no per-k-step barrier).
//!
//! The choice comes from [`TABLE`], measured on the GPU by `benches/bench_cuda_matmul.py` (every
//! candidate timed at the real layer shapes of the 1.5B and 7B layouts for row counts 1..512;
//! `scripts/gen_matmul_table.py` turns its JSON into the table), and from [`heuristic`] for
//! shapes the table does not list; `FAK_CUDA_MM_TABLE` names a table file measured on the machine
//! itself (read first). `FAK_CUDA_MM` (or [`force`], for the benches) pins one choice for every
//! product: `gemv`, `tc:<BN>:<G>:<splits>`, `st:<BN>:<S>:<splits>` or `fr:<BN>:<S>:<splits>`
//! (`splits` 0: the heuristic's).
//!
//! Two modes: a decode step (every sequence of the forward has one new row; the engine's batch
//! says so, [`super::super::CudaBackend::set_batch`]) takes the table's choice for its row
//! bucket; any other forward (prefill chunks, mixed steps, the op tests) takes the GEMV up to 8
//! rows and the unsplit GEMM above, whatever the row count ([`prefill_choice`]).
//!
//! Numerics: every choice computes the same CPU-faithful integer sub-block sums; they differ only
//! in the order of the f32 additions (the GEMV sums a row's 32-value tasks across lanes, the GEMM
//! a super-block at a time along K, each split's partial sums then added in split order; the
//! token tile BN and the k-steps per barrier do not change the order). So a prompt row's result
//! does not depend on the rest of its forward (the unsplit GEMM at any row count, as the CPU
//! backend), and a decode row's result does not depend on the other rows within one row bucket.

use std::sync::Mutex;

use crate::quant::GgmlType;

/// Rows up to which the GEMV covers a product in one launch.
pub const GEMV_MAX_ROWS: usize = 8;

/// How the int8 tensor-core GEMM moves its operands (`rust/kernels/mmq.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `mmq_<fmt>_q8_n<BN>_p<depth>`: each k-step's raw words fetched `depth` (1 or 2) k-steps
    /// ahead into registers, decoded to an int8 tile, `depth` k-steps per barrier.
    Direct { depth: usize },
    /// `mmq_<fmt>_q8_n<BN>_s<stages>`: 256 values of K for the whole tile copied to shared memory
    /// by cp.async, `stages − 1` (1 or 2) ahead, then as the direct mode with two k-steps per
    /// barrier. Needs K % 256 == 0 (else the direct mode, depth 2, runs).
    Staged { stages: usize },
    /// `mmq_<fmt>_q8_n<BN>_f<stages>`: the staged copies, and the MMA fragments built straight
    /// from the raw blocks, one barrier per stage. Q4_K and Q6_K (other formats run the staged
    /// mode).
    Fragment { stages: usize },
}

/// A launch shape of the int8 tensor-core GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tc {
    /// Tokens per tile: 16, 32 or 64.
    pub bn: usize,
    /// Blocks per tile along K (1: no split).
    pub splits: usize,
    pub mode: Mode,
}

/// A kernel choice for one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The GEMV, in launches of up to [`GEMV_MAX_ROWS`] rows.
    Gemv,
    /// The tensor-core GEMM.
    Tc(Tc),
}

/// Row buckets of the table: a product of `n` rows uses the first bucket `≥ n`. One row (a
/// single stream's decode) is a bucket of its own: summed over 1..8 rows, the GEMM's gain at 8
/// rows outweighed the GEMV's at 1 (the 7B twin's single stream fell from 332 to 247 tok/s, run r4).
pub const ROW_BUCKETS: [usize; 9] = [1, 8, 16, 32, 64, 128, 256, 512, usize::MAX];

/// One measured entry: products of `wtype` with rows of `k` into `n_out` outputs, for row
/// counts in the bucket ending at `rows` (see [`ROW_BUCKETS`]).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub wtype: GgmlType,
    pub k: usize,
    pub n_out: usize,
    pub rows: usize,
    pub choice: Choice,
}

/// The measured table (see the module doc); empty entries fall back to [`heuristic`].
pub use super::matmul_table::TABLE;

/// The bucket (its upper end) that `n_rows` falls in.
pub fn bucket(n_rows: usize) -> usize {
    ROW_BUCKETS.iter().copied().find(|&b| n_rows <= b).unwrap_or(usize::MAX)
}

/// k-steps of 32 per split, a multiple of 8 (a super-block), for `splits` wanted over `steps`;
/// returns `(kps, splits)` with the split count that `kps` gives.
pub fn split_k(steps: usize, splits: usize) -> (usize, usize) {
    let splits = splits.clamp(1, steps.div_ceil(8).max(1));
    let kps = steps.div_ceil(splits).next_multiple_of(8).max(8);
    (kps, steps.div_ceil(kps).max(1))
}

/// The GEMM's tokens per tile for `n_rows`.
pub fn tile_n(n_rows: usize) -> usize {
    if n_rows <= 16 {
        16
    } else if n_rows <= 32 {
        32
    } else {
        64
    }
}

/// Split count that brings a grid of `tiles` blocks to about two blocks per SM, with at least two
/// super-blocks (16 k-steps) per split.
pub fn auto_splits(tiles: usize, steps: usize, n_sm: usize) -> usize {
    let want = (2 * n_sm).div_ceil(tiles.max(1));
    want.clamp(1, (steps / 16).max(1))
}

/// The split count for products in `n_rows`'s bucket with tiles of `bn` tokens: decided by the
/// bucket, not the exact row count, so that a row's sums are the same for every row count of
/// the bucket; no split from 257 rows on (prefill chunks fill the GPU with their tiles).
pub fn bucket_splits(k: usize, n_out: usize, n_rows: usize, bn: usize, n_sm: usize) -> usize {
    let b = bucket(n_rows);
    if b > 256 {
        return 1;
    }
    auto_splits(n_out.div_ceil(128) * b.div_ceil(bn), k / 32, n_sm)
}

/// The choice when the table has no entry: the GEMV up to 8 rows; above, the GEMM with the
/// smallest tile that holds the rows (64 from 33 rows on), the K range split until the grid has
/// about two blocks per SM (see [`bucket_splits`]).
pub fn heuristic(k: usize, n_out: usize, n_rows: usize, n_sm: usize) -> Choice {
    if n_rows <= GEMV_MAX_ROWS {
        return Choice::Gemv;
    }
    let bn = tile_n(n_rows);
    Choice::Tc(Tc { bn, splits: bucket_splits(k, n_out, n_rows, bn, n_sm), mode: Mode::Direct { depth: if bn < 64 { 2 } else { 1 } } })
}

static FORCED: Mutex<Option<Choice>> = Mutex::new(None);
static DECODE_ALWAYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Pins `choice` for every quantized product from now on (`None`: back to the table). For the
/// kernel benchmark and the op tests; process-wide by design.
pub fn force(choice: Option<Choice>) {
    *FORCED.lock().unwrap_or_else(|e| e.into_inner()) = choice;
}

/// Makes every product take the decode-step choice (the op tests of the table's choices);
/// process-wide.
pub fn force_decode(on: bool) {
    DECODE_ALWAYS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`force_decode`] is on.
pub fn decode_forced() -> bool {
    DECODE_ALWAYS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Parses `gemv`, `tc:<BN>:<G>:<splits>` (the direct mode), `st:<BN>:<S>:<splits>` (the
/// staged mode, S stages) or `fr:<BN>:<S>:<splits>` (the fragment mode) — `FAK_CUDA_MM`, the benchmark's variant names.
pub fn parse(s: &str) -> Option<Choice> {
    let s = s.trim();
    if s == "gemv" {
        return Some(Choice::Gemv);
    }
    let (kind, rest) = s.split_once(':')?;
    let mut it = rest.split(':');
    let bn: usize = it.next()?.parse().ok()?;
    let d: usize = it.next()?.parse().ok()?;
    let splits: usize = it.next()?.parse().ok()?;
    let mode = match kind {
        "tc" if (1..=2).contains(&d) => Mode::Direct { depth: d },
        "st" if (2..=3).contains(&d) => Mode::Staged { stages: d },
        "fr" if (2..=3).contains(&d) => Mode::Fragment { stages: d },
        _ => return None,
    };
    if ![16, 32, 64].contains(&bn) || it.next().is_some() {
        return None;
    }
    Some(Choice::Tc(Tc { bn, splits, mode }))
}

fn env_choice() -> Option<Choice> {
    static ENV: std::sync::OnceLock<Option<Choice>> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| std::env::var("FAK_CUDA_MM").ok().and_then(|s| parse(&s)))
}

/// Table entries read at start-up from the file `FAK_CUDA_MM_TABLE` names (one entry a line:
/// `WTYPE K N_OUT ROWS VARIANT`, e.g. `Q4_K 1536 1536 16 tc:16:2:3`; `#` comments; ROWS the
/// bucket's upper end, `max` for the last), consulted before [`TABLE`]: a table measured on the
/// machine itself, without a rebuild (`scripts/gen_matmul_table.py --txt` writes the file).
/// Malformed lines are skipped with a warning on stderr.
fn file_table() -> &'static [Entry] {
    static FILE: std::sync::OnceLock<Vec<Entry>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let Ok(path) = std::env::var("FAK_CUDA_MM_TABLE") else { return Vec::new() };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("fak: FAK_CUDA_MM_TABLE={path}: {e}; using the built-in table");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let entry = (f.len() == 5)
                .then(|| {
                    let rows = if f[3] == "max" { Some(usize::MAX) } else { f[3].parse().ok() };
                    Some(Entry { wtype: GgmlType::from_name(f[0])?, k: f[1].parse().ok()?, n_out: f[2].parse().ok()?, rows: rows?, choice: parse(f[4])? })
                })
                .flatten();
            match entry {
                Some(e) => out.push(e),
                None => eprintln!("fak: FAK_CUDA_MM_TABLE: skipping malformed line {line:?}"),
            }
        }
        out
    })
}

/// `FAK_CUDA_MM_G1=1`: every GEMM choice with two k-steps per barrier runs with one (the same
/// numbers; a fallback for bisecting).
fn g1_only() -> bool {
    static G1: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *G1.get_or_init(|| matches!(std::env::var("FAK_CUDA_MM_G1").as_deref(), Ok("1" | "on" | "true" | "yes")))
}

/// The kernel outside decode steps: the GEMV up to 8 rows, else the unsplit GEMM with the
/// smallest tile that holds the rows — in the fragment mode for Q4_K and Q6_K when K % 256 == 0
/// (the same bits as the direct mode, about half its time at 512 rows: 85 against 172 µs for the
/// 1.5B's gate|up, 321 against 790 µs for the 7B's; run r4's sweep), else the direct mode.
pub fn prefill_choice(wtype: GgmlType, k: usize, n_rows: usize) -> Choice {
    if n_rows <= GEMV_MAX_ROWS {
        return Choice::Gemv;
    }
    let mode = if matches!(wtype, GgmlType::Q4_K | GgmlType::Q6_K) && k % 256 == 0 {
        Mode::Fragment { stages: 2 }
    } else {
        Mode::Direct { depth: 1 }
    };
    Choice::Tc(Tc { bn: tile_n(n_rows), splits: 1, mode })
}

/// The kernel for a product of `n_rows` rows of `k` by `n_out` weights of `wtype`, in a decode
/// step (`decode`) or not (see the module doc). A forced or table choice of the GEMM with
/// `splits == 0` takes the heuristic's split count.
pub fn choose(wtype: GgmlType, k: usize, n_out: usize, n_rows: usize, n_sm: usize, decode: bool) -> Choice {
    let forced = *FORCED.lock().unwrap_or_else(|e| e.into_inner());
    let c = forced.or_else(env_choice);
    if c.is_none() && !decode {
        return prefill_choice(wtype, k, n_rows);
    }
    let c = c.or_else(|| {
        let b = bucket(n_rows);
        let hit = |e: &&Entry| e.wtype == wtype && e.k == k && e.n_out == n_out && e.rows == b;
        file_table().iter().find(hit).or_else(|| TABLE.iter().find(hit)).map(|e| e.choice)
    });
    let c = match c {
        Some(Choice::Tc(t)) if t.splits == 0 => Choice::Tc(Tc { splits: bucket_splits(k, n_out, n_rows, t.bn, n_sm), ..t }),
        Some(c) => c,
        None => heuristic(k, n_out, n_rows, n_sm),
    };
    match c {
        Choice::Tc(t @ Tc { mode: Mode::Direct { .. }, .. }) if g1_only() => Choice::Tc(Tc { mode: Mode::Direct { depth: 1 }, ..t }),
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variant name [`parse`] reads back.
    fn name(c: Choice) -> String {
        match c {
            Choice::Gemv => "gemv".into(),
            Choice::Tc(Tc { bn, splits, mode: Mode::Direct { depth } }) => format!("tc:{bn}:{depth}:{splits}"),
            Choice::Tc(Tc { bn, splits, mode: Mode::Staged { stages } }) => format!("st:{bn}:{stages}:{splits}"),
            Choice::Tc(Tc { bn, splits, mode: Mode::Fragment { stages } }) => format!("fr:{bn}:{stages}:{splits}"),
        }
    }

    #[test]
    fn splits_cover_k_in_whole_super_blocks() {
        for steps in [8usize, 28, 48, 280, 592] {
            for want in 1..40 {
                let (kps, s) = split_k(steps, want);
                assert_eq!(kps % 8, 0);
                assert!(s * kps >= steps && (s - 1) * kps < steps, "steps {steps} want {want}: {kps} × {s}");
                assert!(s <= want.max(1));
            }
        }
    }

    #[test]
    fn parse_and_heuristic() {
        assert_eq!(parse("gemv"), Some(Choice::Gemv));
        assert_eq!(parse("tc:16:2:4"), Some(Choice::Tc(Tc { bn: 16, splits: 4, mode: Mode::Direct { depth: 2 } })));
        assert_eq!(parse("st:32:3:5"), Some(Choice::Tc(Tc { bn: 32, splits: 5, mode: Mode::Staged { stages: 3 } })));
        assert_eq!(parse("fr:16:2:4"), Some(Choice::Tc(Tc { bn: 16, splits: 4, mode: Mode::Fragment { stages: 2 } })));
        assert_eq!(parse("tc:8:2:4"), None);
        assert_eq!(parse("st:16:1:4"), None);
        assert_eq!(parse("st:16:4:4"), None);
        for v in ["gemv", "tc:16:2:4", "tc:64:1:0", "st:16:2:3", "st:64:3:1", "fr:32:3:0"] {
            assert_eq!(name(parse(v).unwrap()), v);
        }
        assert_eq!(heuristic(1536, 1536, 4, 132), Choice::Gemv);
        assert_eq!(choose(GgmlType::Q4_K, 1536, 1536, 100, 132, false), Choice::Tc(Tc { bn: 64, splits: 1, mode: Mode::Fragment { stages: 2 } }));
        assert_eq!(choose(GgmlType::Q6_K, 1536, 256, 4096, 132, false), Choice::Tc(Tc { bn: 64, splits: 1, mode: Mode::Fragment { stages: 2 } }));
        assert_eq!(choose(GgmlType::Q8_0, 896, 896, 100, 132, false), Choice::Tc(Tc { bn: 64, splits: 1, mode: Mode::Direct { depth: 1 } }));
        assert_eq!(choose(GgmlType::Q4_K, 1536 + 32, 256, 20, 132, false), Choice::Tc(Tc { bn: 32, splits: 1, mode: Mode::Direct { depth: 1 } }));
        assert_eq!(choose(GgmlType::Q4_K, 1536, 1536, 5, 132, false), Choice::Gemv);
        let Choice::Tc(t) = heuristic(8960, 1536, 16, 132) else { panic!() };
        assert_eq!((t.bn, t.mode), (16, Mode::Direct { depth: 2 }));
        assert!(t.splits > 1);
        let Choice::Tc(t) = heuristic(1536, 151936, 64, 132) else { panic!() };
        assert_eq!((t.bn, t.splits), (64, 1));
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(2), 8);
        assert_eq!(bucket(9), 16);
        assert_eq!(bucket(257), 512);
        assert_eq!(bucket(4096), usize::MAX);
    }
}
