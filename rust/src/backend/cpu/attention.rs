//! Causal grouped-query attention over the paged f16 KV cache, for a batch of sequences with
//! different lengths (prefill rows and decode rows alike), bit-identical to llama.cpp's CPU build.
//!
//! Each task is (sequence, KV head, tile of up to [`ROW_TILE`] consecutive rows, the query heads
//! of that KV head's group). Keys are converted from f16 once per block and reused by every query
//! vector of the tile; values once per task. The arithmetic is that of llama.cpp's default
//! (non-flash) attention, `kq = mul_mat(K, q)`, `softmax_ext(kq · scale + mask)`, `mul_mat(Vᵀ, kq)`:
//! - `q` is rounded to f16 before `q·k` (the f16 `vec_dot_type` of an f16 K);
//! - the softmax is ggml's `ggml_vec_soft_max_f32` (`ggml_v_expf`, sums per 16 in f32 then f64,
//!   one f32 reciprocal);
//! - the normalized probabilities are rounded to f16 before the product with the f16 V;
//! - both f16 products are summed in the order of the kernel llama.cpp runs ([`Chains`]):
//!   llamafile tinyBLAS when the sequence has several rows in the forward (a prompt), ggml's
//!   `ggml_vec_dot_f16` for a single row (a decode step).
//!
//! Matching these roundings matters: quantized activations turn any last-bit difference into
//! whole quantization steps a few layers later (fak vs llama.cpp logits cosine 0.999 from
//! summation order alone), and at numerically sensitive positions of real models (Qwen2.5 at
//! position 1 of "Hello, ...") exact attention and llama.cpp differ by a logits cosine of 0.8.
//! Three passes per task (scores of all blocks, softmax per query, weighted sum of V) since the
//! f16 rounding needs the final normalizer.
//!
//! Sliding window ([`AttnParams::window`]): a row at position `p` attends to `s = max(0, p + 1 −
//! W) ..= p`. A task reads the blocks from the one holding its first row's `s` on (earlier blocks
//! may have been released: `NO_BLOCK` entries are never touched), and each row's softmax sum and
//! `P·V` chains are anchored at its own `s` — as if its context were those `W` keys alone — so a
//! row's bits depend on its position and keys only, never on how rows are tiled, chunked or
//! batched. Without a window `s = 0` and every operation is the one above.

use std::cell::RefCell;

use rayon::prelude::*;

use super::kv::CpuKvCache;
#[cfg(target_arch = "x86_64")]
use super::matmul;
use super::vecops::{self, Isa};
use crate::backend::{AttnParams, BatchPlan};

/// Rows of one sequence processed together by one task (prefill).
pub const ROW_TILE: usize = 16;

/// One unit of parallel work.
#[derive(Debug, Clone, Copy)]
struct Task {
    seq: u32,
    kv_head: u32,
    /// Rows `row_lo..row_hi` relative to the sequence's first row.
    row_lo: u32,
    row_hi: u32,
    /// Query heads `head_lo..head_hi` (absolute head indices, all in `kv_head`'s group).
    head_lo: u32,
    head_hi: u32,
}

#[derive(Default)]
struct Scratch {
    /// Query vectors of the task, f16-rounded, `[nq, hd]`.
    q: Vec<f32>,
    /// Scores, then probabilities, `[nq, ctx_max]`.
    s: Vec<f32>,
    kf: Vec<f32>,
    /// V of one chunk of pass 3 (about [`V_CHUNK`] positions), widened to f32, `[chunk, hd]`.
    vf: Vec<f32>,
    /// Every query's FMA chains of the weighted sum of V, `[nq, 16 or 64, hd]` ([`VChains`]).
    chains: Vec<f32>,
    acc: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Output pointer shared by tasks that write disjoint (row, head) regions.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint regions (distinct (row, head) pairs), see `attention`.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out[r, h, :] = softmax(scale · q[r, h, :] · Kᵀ) · V` over each row's causal context, the last
/// `W` positions of it with a sliding window (see [`crate::backend::Backend::attention`]). `q` and
/// `out` are `[n_rows, n_head · head_dim]`.
///
/// Panics when a block the rows attend to is [`crate::backend::NO_BLOCK`] or past the cache (a
/// table the engine did not keep alive for the window).
pub fn attention(
    q: &[f32],
    cache: &CpuKvCache,
    layer: usize,
    plan: &BatchPlan,
    n_rows: usize,
    p: &AttnParams,
    out: &mut [f32],
) {
    let AttnParams {
        n_head,
        n_head_kv,
        head_dim,
        ..
    } = *p;
    let width = n_head * head_dim;
    assert!(
        q.len() >= n_rows * width && out.len() >= n_rows * width,
        "attention buffers too small"
    );
    assert!(
        n_head % n_head_kv == 0,
        "n_head must be a multiple of n_head_kv"
    );
    let group = n_head / n_head_kv;

    // Tile rows; split GQA groups per head when there are too few tasks to fill the pool.
    let n_tiles: usize = plan
        .seqs
        .iter()
        .map(|s| (s.n_rows as usize).div_ceil(ROW_TILE))
        .sum::<usize>()
        * n_head_kv;
    // Split each GQA group into `parts` tasks only when the tiles alone cannot keep the pool busy
    // (each part converts the group's K/V blocks again).
    let parts = rayon::current_num_threads()
        .div_ceil(n_tiles.max(1))
        .clamp(1, group);
    let heads_per_task = group.div_ceil(parts);
    let mut tasks = Vec::with_capacity(n_tiles * group.div_ceil(heads_per_task));
    for (si, s) in plan.seqs.iter().enumerate() {
        for g in 0..n_head_kv {
            for lo in (0..s.n_rows).step_by(ROW_TILE) {
                for h in (0..group).step_by(heads_per_task) {
                    tasks.push(Task {
                        seq: si as u32,
                        kv_head: g as u32,
                        row_lo: lo,
                        row_hi: (lo + ROW_TILE as u32).min(s.n_rows),
                        head_lo: (g * group + h) as u32,
                        head_hi: (g * group + (h + heads_per_task).min(group)) as u32,
                    });
                }
            }
        }
    }
    let outp = OutPtr(out.as_mut_ptr());
    let run = |t: &Task| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            // SAFETY: each task writes only rows row_lo..row_hi of its sequence and heads
            // head_lo..head_hi; tasks partition (row, head) pairs, and `out` outlives the loop.
            unsafe { attend_task(q, cache, layer, plan, p, t, &mut scratch, outp) };
        })
    };
    if tasks.len() == 1 {
        run(&tasks[0]);
    } else {
        tasks.par_iter().for_each(run);
    }
}

/// # Safety
/// `out` must be valid for `[n_rows, n_head · head_dim]` and no other thread may write the
/// (row, head) region of task `t`.
#[allow(clippy::too_many_arguments)]
unsafe fn attend_task(
    q: &[f32],
    cache: &CpuKvCache,
    layer: usize,
    plan: &BatchPlan,
    p: &AttnParams,
    t: &Task,
    sc: &mut Scratch,
    out: OutPtr,
) {
    let hd = p.head_dim;
    let width = p.n_head * hd;
    let seq = plan.seqs[t.seq as usize];
    let table = &plan.block_tables[seq.table0 as usize..(seq.table0 + seq.n_blocks) as usize];
    let bs = cache.layout.block_size;
    let nh = (t.head_hi - t.head_lo) as usize;
    let n_tile_rows = (t.row_hi - t.row_lo) as usize;
    let nq = n_tile_rows * nh;

    // Gather the tile's query vectors, rounded to f16, r = row_in_tile · nh + head_in_task.
    sc.q.resize(nq * hd, 0.0);
    for i in 0..n_tile_rows {
        let row = (seq.row0 + t.row_lo) as usize + i;
        for hh in 0..nh {
            let h = t.head_lo as usize + hh;
            let dst = &mut sc.q[(i * nh + hh) * hd..][..hd];
            dst.copy_from_slice(&q[row * width + h * hd..][..hd]);
            vecops::round_f16(dst);
        }
    }
    // Context of tile row i: positions lo(i) .. ctx0 + i, with lo(i) = p.window_start(pos of row
    // i) (0 without a window). Scores and V are held from `base` on: the start of the block of
    // the tile's first row's window (rows are in position order, so it has the smallest lo).
    let pos0 = (seq.n_past + t.row_lo) as usize;
    let ctx0 = pos0 + 1;
    let ctx_max = ctx0 + n_tile_rows - 1;
    let lo = |i: usize| p.window_start(pos0 + i);
    let base = lo(0) / bs * bs;
    let stride = ctx_max - base;
    sc.s.resize(nq * stride, 0.0);
    sc.kf.resize(bs * hd, 0.0);
    sc.acc.clear();
    sc.acc.resize(nq * hd, 0.0);
    let isa = if hd.is_multiple_of(8) {
        vecops::isa()
    } else {
        Isa::Scalar
    };
    let n_blocks = ctx_max.div_ceil(bs);
    let kv_head = t.kv_head as usize;
    // llama.cpp's kernel for each row's ubatch: one row (a decode step) runs
    // `ggml_vec_dot_f16`, several rows (a prompt) llamafile's tinyBLAS; their f32 summation
    // orders differ (see `Chains`).
    let row_chains = |i: usize| {
        let pos = seq.n_past + t.row_lo + i as u32;
        if super::llama_ubatch(pos, seq.n_prompt).0 >= 2 {
            Chains::TinyBlas
        } else {
            Chains::VecDot
        }
    };
    // Chunks of whole blocks (block sizes need not divide V_CHUNK).
    let chunk = (V_CHUNK / bs).max(1) * bs;
    sc.vf.resize(chunk * hd, 0.0);
    let b0 = base / bs;

    // Pass 1: scores of every block the tile attends to.
    for (bi, &block) in table.iter().enumerate().take(n_blocks).skip(b0) {
        let kpos = bi * bs;
        let n_k = bs.min(ctx_max - kpos);
        if let Some(&next) = table.get(bi + 1).filter(|_| bi + 1 < n_blocks) {
            vecops::prefetch(cache.k_block(layer, next as usize, kv_head));
        }
        vecops::f16_to_f32(
            &cache.k_block(layer, block as usize, kv_head)[..n_k * hd],
            &mut sc.kf[..n_k * hd],
        );
        for i in 0..n_tile_rows {
            scores(
                isa,
                row_chains(i),
                &sc.q[i * nh * hd..],
                nh,
                &sc.kf,
                n_k,
                hd,
                &mut sc.s[i * nh * stride + kpos - base..],
                stride,
            );
        }
    }
    // Pass 2: softmax of `scale · s` over each query's causal context (its window), probabilities
    // to f16; everything outside it is 0.
    for i in 0..n_tile_rows {
        let (first, valid) = (lo(i) - base, ctx0 + i - base);
        for hh in 0..nh {
            let r = i * nh + hh;
            let row = &mut sc.s[r * stride..(r + 1) * stride];
            let (before, row) = row.split_at_mut(first);
            before.fill(0.0);
            let (live, masked) = row.split_at_mut(valid - first);
            // max over 16 lanes, then over the lanes: the same maximum (max ignores NaN either way)
            let mut m16 = [f32::NEG_INFINITY; 16];
            for ch in live.chunks_mut(16) {
                for (m, x) in m16.iter_mut().zip(ch.iter_mut()) {
                    *x *= p.scale;
                    *m = m.max(*x);
                }
            }
            let max = m16.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let sum = vecops::softmax_exp_sum(live, max);
            let inv = (1.0 / sum) as f32;
            for x in live.iter_mut() {
                *x *= inv;
            }
            vecops::round_f16(live);
            masked.fill(0.0);
        }
    }
    // Pass 3: weighted sum of V over each row's context, a chunk of V_CHUNK positions at a time:
    // the chunk is widened to f32 once, laid out slice-major (`sw` output elements of every
    // position together, so one slice is a contiguous few KB that stays in L1), and each slice
    // applied to every query of the tile (the tile's queries are many; a long context's V is not
    // cache-sized). Each query's FMA chains are carried from chunk to chunk, so each chain sums
    // its positions in order, as before.
    let rows: Vec<VRow> = (0..nq)
        .map(|r| {
            let i = r / nh;
            VRow { first: lo(i) - base, valid: ctx0 + i - base, chains: row_chains(i) }
        })
        .collect();
    let mut vc = VChains::new(&mut sc.chains, rows.iter().map(|r| r.chains), hd, isa);
    let sw = vc.sw;
    let mut c0 = 0;
    while c0 < stride {
        let c1 = (c0 + chunk).min(stride);
        let n_c = c1 - c0;
        // every V value of the chunk finite (no f16 Inf/NaN): a zero weight's FMA then adds an
        // exact zero, so the kernels need not skip it (see `VChains::accumulate_group`)
        let mut finite = true;
        for bi in (b0 + c0 / bs)..(b0 + c1.div_ceil(bs)) {
            let kpos = bi * bs - base - c0;
            let n_k = bs.min(ctx_max - bi * bs);
            let rows = &cache.v_block(layer, table[bi] as usize, kv_head)[..n_k * hd];
            f16_to_slices(rows, hd, sw, &mut sc.vf[..n_c * hd], n_c, kpos);
            finite &= rows.iter().all(|&h| h & 0x7C00 != 0x7C00);
        }
        for ds in 0..hd / sw {
            let vs = &sc.vf[ds * n_c * sw..(ds + 1) * n_c * sw];
            // Rows with the same range and order (the heads of one query position that share
            // this KV head) go through the kernel together, up to 4 at a time: each V slice is
            // then loaded once for all of them.
            let mut r = 0;
            while r < rows.len() {
                let row = &rows[r];
                let same = rows[r..].iter().take(4).take_while(|x| *x == row).count();
                let q = if same == 4 { 4 } else { same.min(2) };
                let (a, b) = (row.first.max(c0), row.valid.min(c1));
                if a < b {
                    let ps: [&[f32]; 4] = std::array::from_fn(|k| {
                        let rk = r + k.min(q - 1);
                        &sc.s[rk * stride + a..rk * stride + b]
                    });
                    vc.accumulate_group(r, &ps[..q], row.chains, a - row.first, &vs[(a - c0) * sw..(b - c0) * sw], ds * sw, finite);
                }
                r += q;
            }
        }
        c0 = c1;
    }
    for (r, row) in rows.iter().enumerate() {
        vc.combine(r, row.chains, &mut sc.acc[r * hd..(r + 1) * hd]);
    }

    for i in 0..n_tile_rows {
        let row = (seq.row0 + t.row_lo) as usize + i;
        for hh in 0..nh {
            let r = i * nh + hh;
            let h = t.head_lo as usize + hh;
            std::ptr::copy_nonoverlapping(
                sc.acc.as_ptr().add(r * hd),
                out.0.add(row * width + h * hd),
                hd,
            );
        }
    }
}

/// The f32 summation order of llama.cpp's f16 dot products (ggml-cpu, x86 AVX-512 build), which
/// fak reproduces so that attention is bit-identical:
/// - [`Chains::TinyBlas`] (llamafile `tinyBLAS<16, __m512>`, a ubatch of ≥ 2 rows): element `i`
///   goes to lane `i mod 16`, each lane a sequential FMA chain, lanes summed by
///   `_mm512_reduce_add_ps` ([`vecops::reduce16`]);
/// - [`Chains::VecDot`] (`ggml_vec_dot_f16`, a single-row ubatch): four 16-lane accumulators,
///   element `i` to chain `i mod 64`, combined `(c0 + c2) + (c1 + c3)`, then
///   `_mm512_reduce_add_ps`; elements past the last multiple of 64 are added in f64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chains {
    TinyBlas,
    VecDot,
}

impl Chains {
    /// Number of independent FMA chains.
    fn n(self) -> usize {
        match self {
            Chains::TinyBlas => 16,
            Chains::VecDot => 64,
        }
    }

    /// Sums the chain partial sums `c` (`self.n()` of them) as llama.cpp does.
    fn combine(self, c: &[f32]) -> f32 {
        match self {
            Chains::TinyBlas => vecops::reduce16(c[..16].try_into().expect("16 chains")),
            Chains::VecDot => {
                let x: [f32; 16] = std::array::from_fn(|l| (c[l] + c[32 + l]) + (c[16 + l] + c[48 + l]));
                vecops::reduce16(&x)
            }
        }
    }
}

/// One f16 dot product `a · b` (values already widened) in llama.cpp's order for `chains`.
fn dot_chains(chains: Chains, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let nc = chains.n();
    let body = match chains {
        Chains::TinyBlas => n,
        Chains::VecDot => n - n % 64,
    };
    let mut c = [0f32; 64];
    for i in 0..body {
        c[i % nc] = a[i].mul_add(b[i], c[i % nc]);
    }
    let mut sum = chains.combine(&c) as f64;
    for i in body..n {
        sum += (a[i] * b[i]) as f64;
    }
    sum as f32
}

/// `s[r·stride + j] = q[r, :] · k[j, :]` for `nq` query vectors and `n_k` keys of `hd` elements,
/// in llama.cpp's order for `chains`.
#[allow(clippy::too_many_arguments)]
fn scores(
    isa: Isa,
    chains: Chains,
    q: &[f32],
    nq: usize,
    k: &[f32],
    n_k: usize,
    hd: usize,
    s: &mut [f32],
    stride: usize,
) {
    assert!(
        q.len() >= nq * hd
            && k.len() >= n_k * hd
            && n_k <= stride
            && (nq == 0 || s.len() >= (nq - 1) * stride + n_k)
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && chains == Chains::TinyBlas && hd.is_multiple_of(16) && avx512f() {
        // SAFETY: AVX2/FMA/F16C (isa) and AVX-512F detected, hd % 16 == 0, lengths checked above.
        unsafe { avx512_scores_tinyblas(q, nq, k, n_k, hd, s, stride) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && hd % chains.n() == 0 {
        // SAFETY: AVX2/FMA/F16C detected (isa), hd a multiple of the chain count, slice lengths
        // checked above.
        unsafe { avx2_scores(chains, q, nq, k, n_k, hd, s, stride) };
        return;
    }
    let _ = isa;
    for r in 0..nq {
        let qr = &q[r * hd..(r + 1) * hd];
        for j in 0..n_k {
            s[r * stride + j] = dot_chains(chains, qr, &k[j * hd..(j + 1) * hd]);
        }
    }
}

/// `out[:] = Σ_j p[j] · v[j, :]` over `j < p.len()`, each output element summed over `j` in
/// llama.cpp's order for `chains` (zero weights skipped: they add exact zeros): the one-query
/// scalar reference of [`VChains`] (pass 3 of [`attend_task`]).
#[cfg(test)]
fn weighted_v(chains: Chains, p: &[f32], v: &[f32], hd: usize, out: &mut [f32]) {
    let n = p.len();
    assert!(v.len() >= n * hd && out.len() >= hd);
    // llama.cpp's row is the KV length padded to a multiple of 256 with zero weights, so
    // `ggml_vec_dot_f16` has no leftovers here.
    let nc = chains.n();
    let mut c = vec![0f32; nc * hd];
    for j in 0..n {
        let w = p[j];
        if w == 0.0 {
            continue;
        }
        let cj = &mut c[(j % nc) * hd..(j % nc + 1) * hd];
        for (x, &y) in cj.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *x = w.mul_add(y, *x);
        }
    }
    let mut lanes = [0f32; 64];
    for (d, o) in out[..hd].iter_mut().enumerate() {
        for l in 0..nc {
            lanes[l] = c[l * hd + d];
        }
        *o = chains.combine(&lanes);
    }
}

/// f16 rows of `hd` values (`rows`, back to back) widened into pass 3's slice-major chunk `vf`
/// (`n_c` positions): element `d` of row `j` goes to `vf[((d / sw) · n_c + pos0 + j) · sw + d % sw]`
/// (with `sw = hd`, plain rows). The widening is exact, so every path gives the same values.
fn f16_to_slices(rows: &[u16], hd: usize, sw: usize, vf: &mut [f32], n_c: usize, pos0: usize) {
    let n = rows.len() / hd;
    assert!(rows.len() == n * hd && hd.is_multiple_of(sw) && pos0 + n <= n_c && vf.len() >= n_c * hd);
    #[cfg(target_arch = "x86_64")]
    if (sw == 16 && avx512f()) || (sw == 8 && vecops::isa() == Isa::Avx2) {
        // SAFETY: AVX-512F (sw 16) or F16C (sw 8) detected; every read is inside `rows` and every
        // write inside `vf` (asserted above).
        unsafe {
            if sw == 16 {
                avx512_f16_to_slices(rows, hd, vf, n_c, pos0);
            } else {
                f16c_to_slices8(rows, hd, vf, n_c, pos0);
            }
        }
        return;
    }
    for (j, row) in rows.chunks_exact(hd).enumerate() {
        for (ds, x) in row.chunks_exact(sw).enumerate() {
            let dst = (ds * n_c + pos0 + j) * sw;
            vecops::f16_to_f32(x, &mut vf[dst..dst + sw]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn avx512_f16_to_slices(rows: &[u16], hd: usize, vf: &mut [f32], n_c: usize, pos0: usize) {
    use std::arch::x86_64::*;
    let (sp, dp) = (rows.as_ptr(), vf.as_mut_ptr());
    for j in 0..rows.len() / hd {
        for ds in 0..hd / 16 {
            let h = _mm256_loadu_si256(sp.add(j * hd + ds * 16) as *const __m256i);
            _mm512_storeu_ps(dp.add((ds * n_c + pos0 + j) * 16), _mm512_cvtph_ps(h));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16c_to_slices8(rows: &[u16], hd: usize, vf: &mut [f32], n_c: usize, pos0: usize) {
    use std::arch::x86_64::*;
    let (sp, dp) = (rows.as_ptr(), vf.as_mut_ptr());
    for j in 0..rows.len() / hd {
        for ds in 0..hd / 8 {
            let h = _mm_loadu_si128(sp.add(j * hd + ds * 8) as *const __m128i);
            _mm256_storeu_ps(dp.add((ds * n_c + pos0 + j) * 8), _mm256_cvtph_ps(h));
        }
    }
}

/// Positions of V widened and applied per chunk in pass 3 of [`attend_task`] (8 KV blocks:
/// 128 KB of f32 V at `head_dim` 128, cache-resident while every query of a tile uses it).
const V_CHUNK: usize = 256;

/// One query vector's context in pass 3: probabilities at tile positions `first..valid`, summed
/// in the order of `chains`.
#[derive(PartialEq)]
struct VRow {
    first: usize,
    valid: usize,
    chains: Chains,
}

/// The FMA chains of [`weighted_v`] for many query vectors, kept across chunks of the context:
/// query `r`'s chain `l` holds `Σ p[j]·v[j, :]` over its positions `j ≡ l (mod chains.n())` so
/// far, each chain in increasing `j` with zero weights skipped (exactly [`weighted_v`]'s
/// operations, in the same order per chain), so [`VChains::combine`] gives [`weighted_v`]'s bits
/// however the context was cut into chunks.
struct VChains<'a> {
    c: &'a mut [f32],
    /// Query `r`'s chains are `c[at[r]..at[r + 1]]` (`chains.n() · hd` values, chain-major).
    at: Vec<usize>,
    hd: usize,
    /// Output elements per slice of V ([`VChains::accumulate_group`]): 16 (AVX-512), 8 (AVX2) or all
    /// `hd` (scalar).
    sw: usize,
    /// Whether [`VChains::accumulate_group`] runs the `sw`-lane SIMD kernel.
    simd: bool,
}

impl<'a> VChains<'a> {
    /// Chains of `hd` elements for queries of the given orders (one each) in `buf` (grown as
    /// needed), for `isa`. A query's chains start at zero with its first position (`j0 = 0` in
    /// [`VChains::accumulate_group`]), so `buf` is not cleared here.
    fn new(buf: &'a mut Vec<f32>, orders: impl Iterator<Item = Chains>, hd: usize, isa: Isa) -> VChains<'a> {
        #[cfg(target_arch = "x86_64")]
        let wide = avx512f();
        #[cfg(not(target_arch = "x86_64"))]
        let wide = false;
        VChains::with_width(buf, orders, hd, isa, wide)
    }

    /// [`VChains::new`] with the 512-bit kernels on or off (`wide`, only where the CPU has
    /// AVX-512F; the tests run both on one machine).
    fn with_width(buf: &'a mut Vec<f32>, orders: impl Iterator<Item = Chains>, hd: usize, isa: Isa, wide: bool) -> VChains<'a> {
        let mut at = vec![0];
        for o in orders {
            at.push(at.last().unwrap() + o.n() * hd);
        }
        let n = *at.last().unwrap();
        if buf.len() < n {
            buf.resize(n, 0.0);
        }
        #[cfg(target_arch = "x86_64")]
        let (sw, simd) = match isa {
            Isa::Avx2 if hd.is_multiple_of(16) && wide => (16, true),
            Isa::Avx2 if hd.is_multiple_of(8) => (8, true),
            _ => (hd, false),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (sw, simd) = {
            let _ = (isa, wide);
            (hd, false)
        };
        VChains { c: &mut buf[..n], at, hd, sw, simd }
    }

    /// [`VChains::accumulate_group`] for the one query `r` (the tests' reference usage).
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    fn accumulate(&mut self, r: usize, chains: Chains, j0: usize, p: &[f32], v: &[f32], d0: usize, finite: bool) {
        self.accumulate_group(r, &[p], chains, j0, v, d0, finite);
    }

    /// Adds `ps[k][i]·v[i, :]` to elements `d0 .. d0 + sw` of query `r0 + k`'s chain `(j0 + i) mod
    /// chains.n()` for each `i`, for up to 4 queries of one order over the same positions (`j0`:
    /// the queries' relative position of `p[0]`; 0 starts the chains from zero); `v` holds the
    /// positions' slices, `sw` values each, back to back. On AVX-512, 2 or 4 queries go through
    /// the kernel together ([`avx512_chains_fma`]: each V slice loaded once for all of them); each
    /// chain still sums its positions in order, so the bits are those of one query at a time.
    ///
    /// `finite`: every value of `v` is finite. A zero weight is skipped (llama.cpp's padded zero
    /// weights add exact zeros, and so must a `0·∞`); with finite values its FMA adds `±0` to a
    /// chain that is never `−0` (chains start at `+0`, and an FMA yields `−0` only from `−0`), an
    /// exact no-op, so the kernels may then run it unmasked: the same bits either way.
    #[allow(clippy::too_many_arguments)]
    fn accumulate_group(&mut self, r0: usize, ps: &[&[f32]], chains: Chains, j0: usize, v: &[f32], d0: usize, finite: bool) {
        let (hd, sw, nc, n) = (self.hd, self.sw, chains.n(), ps[0].len());
        assert!(ps.len() <= 4 && ps.iter().all(|p| p.len() == n) && v.len() >= n * sw && d0 + sw <= hd);
        for k in 0..ps.len() {
            let c = &mut self.c[self.at[r0 + k]..self.at[r0 + k + 1]];
            assert_eq!(c.len(), nc * hd, "query {} was set up for another chain order", r0 + k);
            if j0 == 0 {
                // the query's first positions: its chains (this slice of them) start at zero
                for l in 0..nc {
                    c[l * hd + d0..l * hd + d0 + sw].fill(0.0);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // one base pointer for all the queries' chains (disjoint ranges of `self.c`)
            let base = self.c.as_mut_ptr();
            // SAFETY: query `r0 + k`'s chains are `nc·hd` values from `at[r0 + k]` (asserted), so
            // `at + d0` plus `(nc − 1)·hd + sw` (d0 + sw ≤ hd) stays inside them.
            let c: [*mut f32; 4] = std::array::from_fn(|k| if k < ps.len() { unsafe { base.add(self.at[r0 + k] + d0) } } else { base });
            // SAFETY: AVX2/FMA/F16C detected (isa), AVX-512F for sw 16 (`new`); the chains as
            // above, `v` holds n·sw values (asserted).
            unsafe {
                match (sw, ps.len()) {
                    (16, 4) => avx512_chains_fma::<4, 4>(c, hd, nc, j0, [ps[0], ps[1], ps[2], ps[3]], v, finite),
                    (16, 2) => avx512_chains_fma::<2, 8>([c[0], c[1]], hd, nc, j0, [ps[0], ps[1]], v, finite),
                    (16, _) => {
                        for (k, p) in ps.iter().enumerate() {
                            avx512_chains_fma::<1, 16>([c[k]], hd, nc, j0, [p], v, finite);
                        }
                    }
                    (_, 4) => avx2_chains_fma_q::<4, 2>(c, hd, nc, j0, [ps[0], ps[1], ps[2], ps[3]], v, finite),
                    (_, 2) => avx2_chains_fma_q::<2, 4>([c[0], c[1]], hd, nc, j0, [ps[0], ps[1]], v, finite),
                    _ => {
                        for (k, p) in ps.iter().enumerate() {
                            avx2_chains_fma_q::<1, 8>([c[k]], hd, nc, j0, [p], v, finite);
                        }
                    }
                }
            }
            return;
        }
        for (k, p) in ps.iter().enumerate() {
            let c = &mut self.c[self.at[r0 + k]..self.at[r0 + k + 1]];
            for (i, &w) in p.iter().enumerate() {
                if w == 0.0 {
                    continue;
                }
                let l = (j0 + i) % nc;
                let cl = &mut c[l * hd + d0..l * hd + d0 + sw];
                for (x, &y) in cl.iter_mut().zip(&v[i * sw..(i + 1) * sw]) {
                    *x = w.mul_add(y, *x);
                }
            }
        }
    }

    /// `out[:]` = query `r`'s chains summed as llama.cpp does ([`Chains::combine`]: for the
    /// decode order the four 16-chain groups first, then [`vecops::reduce16`]'s tree), 16 output
    /// elements at a time with the same operations per element (so the compiler can vectorize it).
    fn combine(&self, r: usize, chains: Chains, out: &mut [f32]) {
        let hd = self.hd;
        let c = &self.c[self.at[r]..self.at[r + 1]];
        let mut d0 = 0;
        while d0 + 16 <= hd {
            let o: &mut [f32; 16] = (&mut out[d0..d0 + 16]).try_into().expect("16 outputs");
            combine16(chains, |l| c[l * hd + d0..l * hd + d0 + 16].try_into().expect("16 values"), o);
            d0 += 16;
        }
        if d0 < hd {
            let w = hd - d0;
            let mut o = [0f32; 16];
            combine16(
                chains,
                |l| {
                    let mut x = [0f32; 16];
                    x[..w].copy_from_slice(&c[l * hd + d0..l * hd + hd]);
                    x
                },
                &mut o,
            );
            out[d0..hd].copy_from_slice(&o[..w]);
        }
    }
}

/// AVX2 [`scores`]: per (query, key) the chains of `chains` in 8-lane vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_scores(
    chains: Chains,
    q: &[f32],
    nq: usize,
    k: &[f32],
    n_k: usize,
    hd: usize,
    s: &mut [f32],
    stride: usize,
) {
    use std::arch::x86_64::*;
    let (q, k, s) = (q.as_ptr(), k.as_ptr(), s.as_mut_ptr());
    for r in 0..nq {
        let qr = q.add(r * hd);
        for j in 0..n_k {
            let kj = k.add(j * hd);
            let v = match chains {
                Chains::TinyBlas => {
                    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                    let mut d = 0;
                    while d < hd {
                        lo = _mm256_fmadd_ps(_mm256_loadu_ps(kj.add(d)), _mm256_loadu_ps(qr.add(d)), lo);
                        hi = _mm256_fmadd_ps(_mm256_loadu_ps(kj.add(d + 8)), _mm256_loadu_ps(qr.add(d + 8)), hi);
                        d += 16;
                    }
                    vecops::avx2::reduce16(lo, hi)
                }
                Chains::VecDot => {
                    let mut a = [_mm256_setzero_ps(); 8];
                    let mut d = 0;
                    while d < hd {
                        for (t, at) in a.iter_mut().enumerate() {
                            *at = _mm256_fmadd_ps(_mm256_loadu_ps(kj.add(d + 8 * t)), _mm256_loadu_ps(qr.add(d + 8 * t)), *at);
                        }
                        d += 64;
                    }
                    let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
                    let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
                    vecops::avx2::reduce16(lo, hi)
                }
            };
            *s.add(r * stride + j) = v;
        }
    }
}

/// [`scores`] in the prompt order ([`Chains::TinyBlas`]) on 512-bit vectors, register-blocked
/// (as llamafile's tinyBLAS, whose order this is): tiles of up to 6 queries × 4 keys, one
/// accumulator per score holding its 16 chains (lane `l`: the FMA chain over elements `l, l + 16,
/// …`), so each loaded vector serves several scores; each score is then summed by
/// [`vecops::reduce16`]'s tree. Every score's operations are the per-pair kernel's
/// ([`avx2_scores`]: the same chains, FMAs and tree): the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_scores_tinyblas(q: &[f32], nq: usize, k: &[f32], n_k: usize, hd: usize, s: &mut [f32], stride: usize) {
    let (qp, kp, sp) = (q.as_ptr(), k.as_ptr(), s.as_mut_ptr());
    let mut r0 = 0;
    while r0 < nq {
        let rq = if nq - r0 >= 6 { 6 } else { 1 };
        let mut j0 = 0;
        while j0 < n_k {
            let rk = if n_k - j0 >= 4 { 4 } else { 1 };
            let (qt, kt, st) = (qp.add(r0 * hd), kp.add(j0 * hd), sp.add(r0 * stride + j0));
            match (rq, rk) {
                (6, 4) => scores_tile::<6, 4>(qt, kt, hd, st, stride),
                (6, _) => scores_tile::<6, 1>(qt, kt, hd, st, stride),
                (_, 4) => scores_tile::<1, 4>(qt, kt, hd, st, stride),
                _ => scores_tile::<1, 1>(qt, kt, hd, st, stride),
            }
            j0 += rk;
        }
        r0 += rq;
    }
}

/// One `RQ × RK` tile of [`avx512_scores_tinyblas`]: `s[r·stride + j] = q[r, :] · k[j, :]`.
///
/// # Safety
/// AVX-512F; `q` and `k` valid for `RQ` and `RK` rows of `hd` (a multiple of 16) values, `s` for
/// `RQ` rows of `stride` with `RK ≤ stride`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn scores_tile<const RQ: usize, const RK: usize>(q: *const f32, k: *const f32, hd: usize, s: *mut f32, stride: usize) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); RK]; RQ];
    let mut d = 0;
    while d < hd {
        let kv: [__m512; RK] = std::array::from_fn(|j| _mm512_loadu_ps(k.add(j * hd + d)));
        for (r, ar) in acc.iter_mut().enumerate() {
            let qv = _mm512_loadu_ps(q.add(r * hd + d));
            for (a, &kj) in ar.iter_mut().zip(&kv) {
                *a = _mm512_fmadd_ps(kj, qv, *a);
            }
        }
        d += 16;
    }
    for (r, ar) in acc.iter().enumerate() {
        for (j, &a) in ar.iter().enumerate() {
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            *s.add(r * stride + j) = vecops::avx2::reduce16(lo, hi);
        }
    }
}

/// [`Chains::combine`] of 16 output elements at once (`chain(l)`: chain `l`'s 16 values), the same
/// operations per element in arrays of 16 that the compiler vectorizes.
#[inline]
fn combine16(chains: Chains, chain: impl Fn(usize) -> [f32; 16], out: &mut [f32; 16]) {
    let add = |a: [f32; 16], b: [f32; 16]| -> [f32; 16] { std::array::from_fn(|k| a[k] + b[k]) };
    let x: [[f32; 16]; 16] = match chains {
        Chains::TinyBlas => std::array::from_fn(&chain),
        Chains::VecDot => std::array::from_fn(|l| add(add(chain(l), chain(32 + l)), add(chain(16 + l), chain(48 + l)))),
    };
    let t3: [[f32; 16]; 8] = std::array::from_fn(|i| add(x[8 + i], x[i]));
    let t6: [[f32; 16]; 4] = std::array::from_fn(|i| add(t3[4 + i], t3[i]));
    *out = add(add(t6[0], t6[2]), add(t6[1], t6[3]));
}

/// [`VChains::accumulate_group`] on 8-lane vectors: `c` starts at the slice's first element, chain `l`
/// at `c[l·hd..]`; the `nc` chains are held in a local array while the positions of `v` (8
/// values each, back to back) are walked in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_chains_fma(c: &mut [f32], hd: usize, nc: usize, j0: usize, p: &[f32], v: &[f32]) {
    use std::arch::x86_64::*;
    let (cp, vp) = (c.as_mut_ptr(), v.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 64];
    for (l, a) in acc.iter_mut().enumerate().take(nc) {
        *a = _mm256_loadu_ps(cp.add(l * hd));
    }
    let mut l = j0 % nc;
    for (i, &w) in p.iter().enumerate() {
        if w != 0.0 {
            acc[l] = _mm256_fmadd_ps(_mm256_set1_ps(w), _mm256_loadu_ps(vp.add(8 * i)), acc[l]);
        }
        l = if l + 1 == nc { 0 } else { l + 1 };
    }
    for (l, a) in acc.iter().enumerate().take(nc) {
        _mm256_storeu_ps(cp.add(l * hd), *a);
    }
}

/// [`avx2_chains_fma`] for `Q` queries over the same positions (query `k`: chains at `c[k]`,
/// chain `l` at `c[k] + l·hd`, weights `p[k]`), as [`avx512_chains_fma`] on 8-lane vectors: with
/// 16 chains (the prompt order, [`Chains::TinyBlas`]) the positions from the first one of chain 0
/// go in whole blocks of 16 through [`avx2_chains16_blocks`] (`CP` chains per register group,
/// `Q·CP` = 8 accumulators), the positions before and after those blocks through
/// [`avx2_chains_fma`], in order, so every chain still sums its positions in order: the same bits.
///
/// # Safety
/// AVX2 + FMA; each `c[k]` valid for `(nc − 1)·hd + 8` values, `v` for `8·p[k].len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_chains_fma_q<const Q: usize, const CP: usize>(c: [*mut f32; Q], hd: usize, nc: usize, j0: usize, p: [&[f32]; Q], v: &[f32], finite: bool) {
    let n = p[0].len();
    let (pre, full) = if nc == 16 && n >= 32 {
        let pre = (16 - j0 % 16) % 16;
        (pre, (n - pre) / 16 * 16)
    } else {
        (n, 0)
    };
    let chains = |k: usize| std::slice::from_raw_parts_mut(c[k], (nc - 1) * hd + 8);
    for k in 0..Q {
        avx2_chains_fma(chains(k), hd, nc, j0, &p[k][..pre], v);
    }
    if full == 0 {
        return;
    }
    let (pp, vb) = (std::array::from_fn(|k| p[k][pre..].as_ptr()), v[8 * pre..].as_ptr());
    if finite {
        avx2_chains16_blocks::<Q, CP, false>(c, hd, pp, full, vb);
    } else {
        avx2_chains16_blocks::<Q, CP, true>(c, hd, pp, full, vb);
    }
    let end = pre + full;
    for k in 0..Q {
        avx2_chains_fma(chains(k), hd, nc, j0 + end, &p[k][end..], &v[8 * end..]);
    }
}

/// [`avx512_chains16_blocks`] on 8-lane vectors: the 16 chains of `Q` queries over `n` positions
/// (whole blocks of 16, the first of them chain 0's), in groups of `CP` chains whose `Q·CP`
/// accumulators stay in registers (16 `ymm`: 8 accumulators, a V slice loaded once for the `Q`
/// queries, a broadcast weight); [`avx2_chains_fma`] kept its 16 (or 64) chains in memory, one
/// load and one store per FMA. `SKIP0`: zero weights skipped (needed where `v` may hold an Inf
/// or NaN); else every FMA runs (see [`VChains::accumulate_group`]).
///
/// # Safety
/// AVX2 + FMA; `c[k]` valid for `15·hd + 8` values, `p[k]` for `n`, `v` for `8·n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_chains16_blocks<const Q: usize, const CP: usize, const SKIP0: bool>(c: [*mut f32; Q], hd: usize, p: [*const f32; Q], n: usize, v: *const f32) {
    use std::arch::x86_64::*;
    debug_assert!(16 % CP == 0 && n % 16 == 0);
    for g in 0..16 / CP {
        let l0 = g * CP;
        let mut acc: [[__m256; CP]; Q] = std::array::from_fn(|k| std::array::from_fn(|j| _mm256_loadu_ps(c[k].add((l0 + j) * hd))));
        let mut i = 0;
        while i < n {
            for j in 0..CP {
                let x = _mm256_loadu_ps(v.add(8 * (i + l0 + j)));
                for k in 0..Q {
                    let w = *p[k].add(i + l0 + j);
                    if !SKIP0 || w != 0.0 {
                        acc[k][j] = _mm256_fmadd_ps(_mm256_set1_ps(w), x, acc[k][j]);
                    }
                }
            }
            i += 16;
        }
        for (k, a) in acc.iter().enumerate() {
            for (j, x) in a.iter().enumerate() {
                _mm256_storeu_ps(c[k].add((l0 + j) * hd), *x);
            }
        }
    }
}

/// `acc + w·v[0..16]` (fused), or `acc` itself when `w == 0` (the skipped zero weight), without a
/// branch: a masked FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fma16_skip0(acc: std::arch::x86_64::__m512, w: f32, v: *const f32) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let k: __mmask16 = if w != 0.0 { 0xFFFF } else { 0 };
    _mm512_mask3_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(v), acc, k)
}

/// [`avx2_chains_fma`] on 16-lane vectors (each lane's operations the same: bit-identical), for
/// `Q` queries over the same positions (query `k`: chains at `c[k]`, chain `l` at `c[k] + l·hd`,
/// weights `p[k]`). With 16 chains (the prompt order, [`Chains::TinyBlas`]) the positions from
/// the first one of chain 0 go in whole blocks of 16 through [`avx512_chains16_blocks`] (`CP =
/// 16 / Q` chains per register group); the positions before and after those blocks go through
/// the general loop, in order, so every chain still sums its positions in order.
///
/// # Safety
/// AVX-512F; each `c[k]` valid for `(nc − 1)·hd + 16` values, `v` for `16·p[k].len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_chains_fma<const Q: usize, const CP: usize>(c: [*mut f32; Q], hd: usize, nc: usize, j0: usize, p: [&[f32]; Q], v: &[f32], finite: bool) {
    let n = p[0].len();
    let (pre, full) = if nc == 16 && n >= 32 {
        let pre = (16 - j0 % 16) % 16;
        (pre, (n - pre) / 16 * 16)
    } else {
        (n, 0)
    };
    for k in 0..Q {
        avx512_chains_fma_any(c[k], hd, nc, j0, &p[k][..pre], v);
    }
    if full == 0 {
        return;
    }
    let (pp, vb) = (std::array::from_fn(|k| p[k][pre..].as_ptr()), v[16 * pre..].as_ptr());
    if finite {
        avx512_chains16_blocks::<Q, CP, false>(c, hd, pp, full, vb);
    } else {
        avx512_chains16_blocks::<Q, CP, true>(c, hd, pp, full, vb);
    }
    let end = pre + full;
    for k in 0..Q {
        avx512_chains_fma_any(c[k], hd, nc, j0 + end, &p[k][end..], &v[16 * end..]);
    }
}

/// The 16 chains of `Q` queries over `n` positions (whole blocks of 16, the first of them chain
/// 0's): chain `l` of query `k` (16 values at `c[k] + l·hd`) gets `p[k][i]·v[i]` for the positions
/// `i ≡ l (mod 16)`, in order. The chains go in groups of `CP` (`Q·CP = 16`), so that the group's
/// `Q·CP` accumulators stay in registers; each V slice is then loaded once for the `Q` queries
/// (one query's kernel loads one slice and one weight per FMA, two loads, the load ports' limit).
/// `SKIP0`: zero weights are masked off (needed where `v` may hold an Inf or NaN); else every FMA
/// runs (see [`VChains::accumulate_group`]).
///
/// # Safety
/// AVX-512F; `c[k]` valid for `15·hd + 16` values, `p[k]` for `n`, `v` for `16·n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn avx512_chains16_blocks<const Q: usize, const CP: usize, const SKIP0: bool>(c: [*mut f32; Q], hd: usize, p: [*const f32; Q], n: usize, v: *const f32) {
    use std::arch::x86_64::*;
    debug_assert!(Q * CP == 16 && n % 16 == 0);
    for g in 0..Q {
        let l0 = g * CP;
        let mut acc: [[__m512; CP]; Q] = std::array::from_fn(|k| std::array::from_fn(|j| _mm512_loadu_ps(c[k].add((l0 + j) * hd))));
        let mut i = 0;
        while i < n {
            for j in 0..CP {
                let x = v.add(16 * (i + l0 + j));
                for k in 0..Q {
                    let w = *p[k].add(i + l0 + j);
                    acc[k][j] = if SKIP0 { fma16_skip0(acc[k][j], w, x) } else { _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(x), acc[k][j]) };
                }
            }
            i += 16;
        }
        for (k, a) in acc.iter().enumerate() {
            for (j, x) in a.iter().enumerate() {
                _mm512_storeu_ps(c[k].add((l0 + j) * hd), *x);
            }
        }
    }
}

/// [`avx512_chains_fma`] for any chain count: the chains in a local array, the positions walked
/// in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn avx512_chains_fma_any(cp: *mut f32, hd: usize, nc: usize, j0: usize, p: &[f32], v: &[f32]) {
    use std::arch::x86_64::*;
    if p.is_empty() {
        return;
    }
    let vp = v.as_ptr();
    let mut acc = [_mm512_setzero_ps(); 64];
    for (l, a) in acc.iter_mut().enumerate().take(nc) {
        *a = _mm512_loadu_ps(cp.add(l * hd));
    }
    let mut l = j0 % nc;
    for (i, &w) in p.iter().enumerate() {
        acc[l] = fma16_skip0(acc[l], w, vp.add(16 * i));
        l = if l + 1 == nc { 0 } else { l + 1 };
    }
    for (l, a) in acc.iter().enumerate().take(nc) {
        _mm512_storeu_ps(cp.add(l * hd), *a);
    }
}

/// Whether the 512-bit paths run (the [`VChains::accumulate_group`] chains, the tinyBLAS scores):
/// the CPU has AVX-512F and the CPU backend's SIMD level ([`matmul::active_level`], which
/// `FAK_CPU_SIMD=avx2` lowers, so that an AVX-512 machine measures an AVX2-only one's paths) is
/// AVX-512. Same results either way; `FAK_CPU_ISA=scalar` goes below both through [`Isa`].
#[cfg(target_arch = "x86_64")]
fn avx512f() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| is_x86_feature_detected!("avx512f") && matmul::active_level() == matmul::SimdLevel::Avx512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{KvLayout, LogitRows};

    /// Deterministic pseudo-random values in [-1, 1).
    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Naive f64 attention of one sequence over K/V `[ctx, n_kv, hd]` (already f16-rounded), with
    /// llama.cpp's roundings: `q` to f16 before `q·k`, normalized probabilities to f16.
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n_past: usize,
        n_rows: usize,
        p: &AttnParams,
    ) -> (Vec<f32>, Vec<f32>) {
        let q = round_f16(q);
        let (nh, nkv, hd) = (p.n_head, p.n_head_kv, p.head_dim);
        let mut out = vec![0f32; n_rows * nh * hd];
        // Per output: the change one f16 rounding step of every probability can cause (the
        // kernel's softmax, ggml's, may round a probability the other way than f64 does).
        let mut bound = vec![0f32; n_rows * nh * hd];
        for i in 0..n_rows {
            let ctx = n_past + i + 1;
            // Brute-force mask: key t is seen iff t <= pos and pos - t < W (no window: all t).
            let seen = |t: usize| p.window.is_none_or(|w| ctx - 1 - t < w as usize);
            for h in 0..nh {
                let g = h / (nh / nkv);
                let qv = &q[(i * nh + h) * hd..][..hd];
                let s: Vec<f64> = (0..ctx)
                    .map(|t| {
                        if !seen(t) {
                            return f64::NEG_INFINITY;
                        }
                        (0..hd)
                            .map(|d| qv[d] as f64 * k[(t * nkv + g) * hd + d] as f64)
                            .sum::<f64>()
                            * p.scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                let pr: Vec<f64> = e
                    .iter()
                    .map(|x| half::f16::from_f64(x / z).to_f64())
                    .collect();
                for d in 0..hd {
                    let o: f64 = (0..ctx)
                        .map(|t| pr[t] * v[(t * nkv + g) * hd + d] as f64)
                        .sum::<f64>();
                    out[(i * nh + h) * hd + d] = o as f32;
                    bound[(i * nh + h) * hd + d] = (0..ctx)
                        .map(|t| pr[t] * 2f64.powi(-10) * (v[(t * nkv + g) * hd + d] as f64).abs())
                        .sum::<f64>() as f32;
                }
            }
        }
        (out, bound)
    }

    fn round_f16(x: &[f32]) -> Vec<f32> {
        x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
    }

    /// Several sequences with different histories and new-row counts, scattered blocks: every
    /// output row must match the naive attention of its own sequence. With a window, the table
    /// entries of blocks wholly before the first new row's window are `NO_BLOCK` in the batch (as
    /// the engine leaves them once released): reading one would panic.
    fn check(p: AttnParams, block_size: usize, seqs: &[(usize, usize)]) {
        let kvw = p.n_head_kv * p.head_dim;
        let max_blocks = 64.max(seqs.iter().map(|&(p, n)| (p + n).div_ceil(block_size)).sum::<usize>() + 8);
        let layout = KvLayout {
            n_layer: 2,
            n_blocks: max_blocks,
            block_size,
            n_head_kv: p.n_head_kv,
            head_dim: p.head_dim,
            state_layers: 0,
            state_slots: 0,
            state_len: 0,
        };
        let mut cache = CpuKvCache::new(layout).unwrap();
        // Allocate blocks in a scrambled order so that tables are not contiguous.
        let mut free: Vec<u32> = (0..max_blocks as u32).rev().collect();
        free.sort_by_key(|b| (b * 37) % max_blocks as u32);
        let mut all_k = Vec::new();
        let mut all_v = Vec::new();
        let mut tables = Vec::new();
        // History: write each sequence's first n_past tokens in its own batch.
        for (si, &(n_past, n_new)) in seqs.iter().enumerate() {
            let total = n_past + n_new;
            let table: Vec<u32> = (0..total.div_ceil(block_size))
                .map(|_| free.pop().unwrap())
                .collect();
            let k = rand_vec(total * kvw, 100 + si as u64);
            let v = rand_vec(total * kvw, 200 + si as u64);
            if n_past > 0 {
                let mut plan = BatchPlan::default();
                plan.push_seq(&vec![0; n_past], 0, &table, block_size, LogitRows::None);
                cache.write(1, &k[..n_past * kvw], &v[..n_past * kvw], &plan, n_past);
            }
            all_k.push(k);
            all_v.push(v);
            tables.push(table);
        }
        // The batch: every sequence's new rows.
        let mut plan = BatchPlan::default();
        let mut kb = Vec::new();
        let mut vb = Vec::new();
        for (si, &(n_past, n_new)) in seqs.iter().enumerate() {
            let mut table = tables[si].clone();
            let dead = p.window_start(n_past) / block_size;
            table[..dead].fill(crate::backend::NO_BLOCK);
            plan.push_seq(
                &vec![0; n_new],
                n_past,
                &table,
                block_size,
                LogitRows::Last,
            );
            kb.extend_from_slice(&all_k[si][n_past * kvw..]);
            vb.extend_from_slice(&all_v[si][n_past * kvw..]);
        }
        let n_rows = plan.n_tokens();
        cache.write(1, &kb, &vb, &plan, n_rows);
        let width = p.n_head * p.head_dim;
        let q = rand_vec(n_rows * width, 7);
        let mut out = vec![f32::NAN; n_rows * width];
        attention(&q, &cache, 1, &plan, n_rows, &p, &mut out);
        for (si, &(n_past, n_new)) in seqs.iter().enumerate() {
            let row0 = plan.seqs[si].row0 as usize;
            let (want, bound) = naive(
                &q[row0 * width..(row0 + n_new) * width],
                &round_f16(&all_k[si]),
                &round_f16(&all_v[si]),
                n_past,
                n_new,
                &p,
            );
            let got = &out[row0 * width..(row0 + n_new) * width];
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 2e-5 + bound[j], "seq {si} elem {j}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn matches_naive_gqa_prefill_and_decode_mixed() {
        let p = AttnParams {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 64,
            scale: 0.125,
            window: None,
        };
        // (tokens already cached, new rows): decode rows, a fresh prefill, a chunked prefill.
        check(p, 16, &[(0, 37), (20, 1), (47, 1), (33, 18), (0, 1)]);
    }

    #[test]
    fn matches_naive_odd_head_dim_and_mha() {
        // head_dim not a multiple of 8 takes the portable path; MHA (group of 1).
        let p = AttnParams {
            n_head: 3,
            n_head_kv: 3,
            head_dim: 12,
            scale: 1.0 / 12f32.sqrt(),
            window: None,
        };
        check(p, 8, &[(5, 3), (0, 20)]);
    }

    #[test]
    fn matches_naive_many_decode_rows() {
        let p = AttnParams {
            n_head: 14,
            n_head_kv: 2,
            head_dim: 64,
            scale: 0.125,
            window: None,
        };
        let seqs: Vec<(usize, usize)> = (0..9).map(|i| (i * 13 % 70, 1)).collect();
        check(p, 32, &seqs);
    }

    /// Sliding windows: rows below and above `W`, decode and (chunked) prefill rows, batched with
    /// sequences of other lengths, windows smaller than, equal to and larger than a block, and a
    /// window of 1 (each row sees only itself).
    #[test]
    fn windowed_matches_masked_naive() {
        for (w, bs) in [(1, 16), (5, 8), (16, 16), (37, 16), (64, 32), (100, 16)] {
            let p = AttnParams {
                n_head: 6,
                n_head_kv: 2,
                head_dim: 64,
                scale: 0.125,
                window: Some(w),
            };
            check(p, bs, &[(0, 70), (20, 1), (150, 1), (90, 33), (0, 1), (3, 4), (200, 17)]);
        }
        let p = AttnParams {
            n_head: 3,
            n_head_kv: 3,
            head_dim: 12,
            scale: 1.0 / 12f32.sqrt(),
            window: Some(9),
        };
        check(p, 8, &[(40, 3), (0, 20), (11, 1)]);
    }

    /// A window at least as long as the context is no window at all: the same bits.
    #[test]
    fn wide_window_is_bit_identical_to_none() {
        let kvw = 2 * 64;
        let layout = KvLayout { n_layer: 1, n_blocks: 16, block_size: 16, n_head_kv: 2, head_dim: 64, state_layers: 0, state_slots: 0, state_len: 0 };
        let mut cache = CpuKvCache::new(layout).unwrap();
        let table: Vec<u32> = (0..8).rev().collect();
        let n = 100;
        let mut plan = BatchPlan::default();
        plan.push_seq(&vec![0; n], 0, &table, 16, LogitRows::None);
        cache.write(0, &rand_vec(n * kvw, 1), &rand_vec(n * kvw, 2), &plan, n);
        let mut batch = BatchPlan::default();
        batch.push_seq(&[0; 30], 70, &table, 16, LogitRows::None);
        batch.push_seq(&[0], 99, &table, 16, LogitRows::None);
        let q = rand_vec(31 * 6 * 64, 3);
        let run = |window| {
            let p = AttnParams { n_head: 6, n_head_kv: 2, head_dim: 64, scale: 0.125, window };
            let mut out = vec![0f32; 31 * 6 * 64];
            attention(&q, &cache, 0, &batch, 31, &p, &mut out);
            out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
        };
        assert_eq!(run(None), run(Some(100)));
        assert_eq!(run(None), run(Some(u32::MAX)));
        assert_ne!(run(None), run(Some(99)), "a window of 99 drops key 0 of the last row");
    }

    /// A row's output does not depend on the tile it lands in: the same row computed as part of a
    /// prefill chunk (tiles of 16 rows starting elsewhere) and alone gives the same bits.
    #[test]
    fn windowed_row_is_independent_of_tiling() {
        let kvw = 2 * 64;
        let layout = KvLayout { n_layer: 1, n_blocks: 16, block_size: 16, n_head_kv: 2, head_dim: 64, state_layers: 0, state_slots: 0, state_len: 0 };
        let mut cache = CpuKvCache::new(layout).unwrap();
        let table: Vec<u32> = (0..12).collect();
        let n = 180;
        let mut plan = BatchPlan::default();
        plan.push_seq(&vec![0; n], 0, &table, 16, LogitRows::None);
        cache.write(0, &rand_vec(n * kvw, 1), &rand_vec(n * kvw, 2), &plan, n);
        let p = AttnParams { n_head: 6, n_head_kv: 2, head_dim: 64, scale: 0.125, window: Some(45) };
        let width = 6 * 64;
        let q = rand_vec(n * width, 3);
        // All 180 rows as one prompt (n_prompt = 180), then rows 100..150 as a chunk at n_past 100
        // of the same prompt, then row 120 alone: rows 100.. start tiles at different offsets.
        let run = |n_past: usize, rows: usize| {
            let mut b = BatchPlan::default();
            b.push_seq(&vec![0; rows], n_past, &table, 16, LogitRows::None);
            b.set_prompt_len(n);
            let mut out = vec![0f32; rows * width];
            attention(&q[n_past * width..(n_past + rows) * width], &cache, 0, &b, rows, &p, &mut out);
            out
        };
        let all = run(0, n);
        let chunk = run(103, 47);
        let one = run(120, 1);
        assert_eq!(&all[103 * width..150 * width], &chunk[..]);
        assert_eq!(&all[120 * width..121 * width], &one[..]);
    }

    /// The scalar and SIMD scores of both llama.cpp summation orders give the same bits (the
    /// weighted sum of V: `chunked_v_chains_equal_weighted_v`).
    #[test]
    fn scalar_and_simd_paths_agree_bit_for_bit() {
        for chains in [Chains::TinyBlas, Chains::VecDot] {
            for (nq, n_k, hd, stride) in [(5, 13, 128, 13), (1, 32, 64, 40), (2, 70, 64, 70), (6, 32, 128, 32), (7, 33, 128, 40), (13, 5, 64, 9)] {
                let q = rand_vec(nq * hd, 1);
                let k = rand_vec(n_k * hd, 2);
                let mut s1 = vec![0f32; nq * stride];
                let mut s2 = vec![0f32; nq * stride];
                scores(Isa::Scalar, chains, &q, nq, &k, n_k, hd, &mut s1, stride);
                scores(vecops::isa(), chains, &q, nq, &k, n_k, hd, &mut s2, stride);
                assert_eq!(s1, s2, "scores {chains:?} {nq}x{n_k}x{hd}");
            }
        }
    }

    /// The (ISA, 512-bit kernels) pairs [`VChains`] can run here: scalar; AVX2 with the 8-lane
    /// kernels (what an AVX2-only CPU runs: `avx2_chains16_blocks`) and, where the CPU has
    /// AVX-512F, the 16-lane ones.
    fn isa_widths() -> Vec<(Isa, bool)> {
        let mut v = vec![(Isa::Scalar, false)];
        if vecops::isa() == Isa::Avx2 {
            v.push((Isa::Avx2, false));
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx512f") {
                v.push((Isa::Avx2, true));
            }
        }
        v
    }

    /// The chunked weighted sum of pass 3 ([`VChains`]) gives [`weighted_v`]'s bits for each query,
    /// however the context is cut into chunks and wherever a query's positions start (a window),
    /// for both chain orders, at every ISA (scalar; AVX2 at hd 24, 64, 128; AVX-512 at 64, 128; hd 20 scalar
    /// only), with zero weights skipped: also where V holds an Inf (at a zero weight: never 0·Inf).
    #[test]
    fn chunked_v_chains_equal_weighted_v() {
        for (isa, wide) in isa_widths() {
            for chains in [Chains::TinyBlas, Chains::VecDot] {
                for hd in [20, 24, 64, 128] {
                    for (n, first, chunk, finite) in [(1, 0, 256, true), (17, 3, 5, true), (100, 0, 32, false), (300, 37, 256, true), (300, 37, 256, false), (600, 5, 64, true)] {
                        let mut v = rand_vec(n * hd, 11 + n as u64);
                        if !finite {
                            // an Inf where the weight is 0: skipped, never 0·Inf = NaN
                            for j in (3..n).step_by(7) {
                                v[j * hd + j % hd] = f32::INFINITY;
                            }
                        }
                        let p: Vec<f32> = rand_vec(n, 13).iter().enumerate().map(|(j, &x)| if j % 7 == 3 { 0.0 } else { x }).collect();
                        let mut want = vec![f32::NAN; hd];
                        weighted_v(chains, &p[first..], &v[first * hd..], hd, &mut want);
                        let mut buf = vec![f32::NAN; 128 * hd]; // stale: the chains must start at zero themselves
                        let mut vc = VChains::with_width(&mut buf, [Chains::VecDot, chains].into_iter(), hd, isa, wide);
                        let sw = vc.sw;
                        let mut c0 = 0;
                        while c0 < n {
                            let c1 = (c0 + chunk).min(n);
                            let a = first.max(c0);
                            for ds in 0..hd / sw {
                                // positions a..c1 of slice ds, back to back (pass 3's layout)
                                let vs: Vec<f32> = (a..c1).flat_map(|j| v[j * hd + ds * sw..][..sw].to_vec()).collect();
                                if a < c1 {
                                    vc.accumulate(1, chains, a - first, &p[a..c1], &vs, ds * sw, finite);
                                }
                            }
                            c0 = c1;
                        }
                        let mut got = vec![f32::NAN; hd];
                        vc.combine(1, chains, &mut got);
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                        assert_eq!(bits(&got), bits(&want), "{isa:?} wide {wide} {chains:?} hd {hd} n {n} first {first} chunk {chunk}");
                    }
                }
            }
        }
    }

    /// `accumulate_group` (several queries through the kernel that loads each V slice once) gives
    /// the bits of one `accumulate` per query: groups of 1, 2 and 4, every phase of the chains,
    /// lengths around the 16-position blocks, finite and non-finite V, stale buffers, chunks
    /// continued from earlier ones.
    #[test]
    fn grouped_v_chains_equal_one_query_at_a_time() {
        for (isa, wide) in isa_widths() {
            for chains in [Chains::TinyBlas, Chains::VecDot] {
                for hd in [64, 128] {
                    for q in [1, 2, 4] {
                        for (j0, n) in [(0, 1), (0, 32), (0, 33), (5, 100), (16, 31), (37, 256), (3, 48), (0, 300)] {
                            for finite in [true, false] {
                                let mut v = rand_vec(n * hd, 7 + n as u64);
                                if !finite {
                                    for j in (3..n).step_by(7) {
                                        v[j * hd + j % hd] = f32::INFINITY;
                                    }
                                }
                                let ps: Vec<Vec<f32>> = (0..q)
                                    .map(|k| rand_vec(n, 40 + k as u64).iter().enumerate().map(|(j, &x)| if j % 7 == 3 { 0.0 } else { x }).collect())
                                    .collect();
                                let run = |grouped: bool| {
                                    let mut buf = vec![f32::NAN; 4 * 64 * hd];
                                    let mut vc = VChains::with_width(&mut buf, std::iter::repeat_n(chains, q), hd, isa, wide);
                                    let sw = vc.sw;
                                    // a first chunk of 40 positions one query at a time (the chains
                                    // start), then the chunk under test from phase j0 on
                                    let pre: Vec<Vec<f32>> = (0..q).map(|k| rand_vec(40, 90 + k as u64)).collect();
                                    let vpre = rand_vec(40 * hd, 91);
                                    for ds in 0..hd / sw {
                                        let vs: Vec<f32> = (0..40).flat_map(|j| vpre[j * hd + ds * sw..][..sw].to_vec()).collect();
                                        let vt: Vec<f32> = (0..n).flat_map(|j| v[j * hd + ds * sw..][..sw].to_vec()).collect();
                                        for (k, p) in pre.iter().enumerate() {
                                            if j0 > 0 {
                                                vc.accumulate(k, chains, 0, &p[..j0.min(40)], &vs, ds * sw, true);
                                            }
                                        }
                                        let refs: Vec<&[f32]> = ps.iter().map(|p| p.as_slice()).collect();
                                        if grouped {
                                            vc.accumulate_group(0, &refs, chains, j0.min(40), &vt, ds * sw, finite);
                                        } else {
                                            for (k, p) in refs.iter().enumerate() {
                                                vc.accumulate(k, chains, j0.min(40), p, &vt, ds * sw, finite);
                                            }
                                        }
                                    }
                                    (0..q)
                                        .flat_map(|k| {
                                            let mut o = vec![f32::NAN; hd];
                                            vc.combine(k, chains, &mut o);
                                            o.into_iter().map(f32::to_bits)
                                        })
                                        .collect::<Vec<u32>>()
                                };
                                assert_eq!(run(true), run(false), "{isa:?} wide {wide} {chains:?} hd {hd} q {q} j0 {j0} n {n} finite {finite}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// `Chains::TinyBlas` is 16 FMA chains over `i mod 16` summed by `reduce16`;
    /// `Chains::VecDot` 64 chains combined `(c0 + c2) + (c1 + c3)` first.
    #[test]
    fn chains_follow_ggml_orders() {
        let a = rand_vec(128, 3);
        let b = rand_vec(128, 4);
        let mut c16 = [0f32; 16];
        let mut c64 = [0f32; 64];
        for i in 0..128 {
            c16[i % 16] = a[i].mul_add(b[i], c16[i % 16]);
            c64[i % 64] = a[i].mul_add(b[i], c64[i % 64]);
        }
        assert_eq!(dot_chains(Chains::TinyBlas, &a, &b), vecops::reduce16(&c16));
        let x: [f32; 16] = std::array::from_fn(|l| (c64[l] + c64[32 + l]) + (c64[16 + l] + c64[48 + l]));
        assert_eq!(dot_chains(Chains::VecDot, &a, &b), vecops::reduce16(&x));
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((dot_chains(Chains::VecDot, &a, &b) as f64 - exact).abs() < 1e-4);
    }
}
