//! The register-tiled k-quant prefill: the driver of the kernels on AVX-512 VNNI (Q4_K:
//! [`tiled_q4k`](super::tiled_q4k), Q6_K: [`tiled_q6k`](super::tiled_q6k)) and on AVX2
//! ([`tiled_avx2`](super::tiled_avx2), both formats). Weight rows are repacked per call into
//! panels of [`PANEL`] rows, one per i32 lane of a `zmm` (AVX2: of two `ymm`) (llama.cpp's
//! repacked-weights layout idea, ggml-cpu `repack.cpp`, done per call here so the mmapped GGUF
//! stays as it is), and each panel is dotted with tiles of up to [`TILE_ROWS`] activation rows, 4
//! activation bytes broadcast into each `vpdpbusd` (AVX2: `vpmaddubsw`). Each format keeps the
//! one-row kernel's exact integers and f32 order (its module says how), so results are
//! bit-identical to it at either level; rows of an order the tiled kernel does not implement go to
//! the one-row kernel (`fallback`).
//!
//! Work: rayon tasks over groups of panels (each task repacks its panels once), and over activation
//! rows when the panels are few; inside a task the activation rows go in chunks that stay in L2
//! while the task's panels pass over them.

#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

use super::act::{BlockQ8K, LlamaRow};
use super::{Kernel, OutPtr, MAX_ROWS, MAX_W};
use rayon::prelude::*;

/// Weight rows per panel: one per i32 lane of a 512-bit vector (AVX2: of two 256-bit vectors).
pub(super) const PANEL: usize = 16;
/// Activation rows per inner loop (the tile height).
pub(super) const TILE_ROWS: usize = 4;
/// Fewest activation rows for which the tiled Q4_K kernels are used (both levels): at 8 rows the
/// tiled AVX-512 Q4_K 8960 × 1536 matmul (repack included) took 1.10 ms against the one-row
/// kernel's 1.20–1.27 ms, at 4 rows 0.94–0.98 against 0.54 ms (Intel Xeon, 2 threads, weights in
/// L3; 2026-12-02); the AVX2 one at 8 rows 75–100 against 64–68 GFLOP per CPU-second (2026-12-07).
pub(super) const MIN_ROWS_Q4K: usize = 8;
/// The same for Q6_K (both levels): its repack costs more per weight row (the 6-bit values
/// assembled), so at 8 rows the tiled kernels lost on the 1.5B's large matrices (61–66 against
/// 82–100 GFLOP per CPU-second), at 16 they win (AVX2 97–115 against 83–87, AVX-512 114–137
/// against 89–107; Intel Xeon, 2026-12-07).
pub(super) const MIN_ROWS_Q6K: usize = 16;
/// Bytes of activations a task keeps in L2 under its panels.
const CHUNK_BYTES: usize = 384 << 10;
/// Most bytes of repacked panels per task.
const PANEL_BYTES: usize = 2 << 20;

/// 64 bytes, 64-byte aligned: the unit of [`with_panels`]' scratch.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

thread_local! {
    /// Each thread's panel scratch, kept between calls: a prefill or a MoE layer makes hundreds of
    /// tiled calls, and a fresh zeroed buffer per task cost a memset and page faults each time
    /// (≈ 5 % of a qwen3moe prefill).
    static PANELS: core::cell::RefCell<Vec<Line>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `n` panels of this thread's scratch, whose contents are arbitrary (earlier calls'
/// panels, or zeros); a fresh buffer of `zero`s if the scratch is in use.
fn with_panels<P: Copy, R>(n: usize, zero: P, f: impl FnOnce(&mut [P]) -> R) -> R {
    const { assert!(core::mem::align_of::<P>() <= 64 && core::mem::size_of::<P>() % 64 == 0) };
    PANELS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut lines) => {
            let need = n * core::mem::size_of::<P>() / 64;
            if lines.len() < need {
                lines.resize(need, Line([0; 64]));
            }
            // SAFETY: `need` initialized, 64-byte aligned lines hold `n` values of `P` (size a
            // multiple of 64, alignment ≤ 64), and a panel is plain data (integer and float
            // arrays: every bit pattern is a valid value, `TiledFormat::Panel`).
            f(unsafe { core::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut P, n) })
        }
        Err(_) => f(&mut vec![zero; n]),
    })
}

/// A k-quant format's tiled kernel.
pub(super) trait TiledFormat {
    /// One super-block of [`PANEL`] weight rows, repacked: plain data (arrays of integers and
    /// floats, every bit pattern valid), a multiple of 64 bytes, aligned to at most 64.
    type Panel: Copy + Send + Sync;
    const ZERO: Self::Panel;
    /// Bytes of one weight block in the GGUF.
    const BYTES: usize;
    /// The kernel's order for a row (`tile`'s `mode`), or `None`: the row goes to the one-row kernel.
    fn mode(row: LlamaRow) -> Option<bool>;
    /// Per activation row and block, what `tile` reads besides the blocks (`[]` if nothing).
    fn aux(a: &[BlockQ8K]) -> Vec<[i32; 4]>;
    /// Repacks `rows` (≤ [`PANEL`]) weight rows, `row_bytes` apart in `w`, into `out[..nb]`; lanes
    /// past `rows` are zero.
    ///
    /// # Safety
    /// The CPU supports the format's instructions (as for `tile`).
    unsafe fn repack(w: &[u8], row_bytes: usize, rows: usize, nb: usize, out: &mut [Self::Panel]);
    /// `out[r·out_stride + c] = W_row(c) · a_row(r)`, `r < nr` (1..=[`TILE_ROWS`]), `c < cols`.
    ///
    /// # Safety
    /// `p` holds `nb` panels, `a` (and `aux` where used) `nr` rows of `nb`, `out` `nr` rows of
    /// `cols` floats; the CPU supports AVX-512 F/BW/VL/VNNI.
    unsafe fn tile(mode: bool, nr: usize, p: *const Self::Panel, nb: usize, a: *const BlockQ8K, aux: *const [i32; 4], out: *mut f32, out_stride: usize, cols: usize);
}

/// Whether any of the `n_rows` rows of `a` (`nb` blocks each) takes `F`'s tiled kernel.
pub(super) fn any_tiled<F: TiledFormat>(a: &[BlockQ8K], nb: usize) -> bool {
    a.iter().step_by(nb).any(|b| F::mode(b.row).is_some())
}

/// `y = x · Wᵀ` for `F` weights `w` (`n_out` rows of `nb` blocks) and Q8_K activations `a`
/// (`n_rows` rows of `nb` blocks, each row's [`LlamaRow`] in its blocks), `y` `[n_rows, n_out]`;
/// rows without a tiled order through `fallback` (the format's one-row kernel); on the current
/// rayon pool.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI and `fallback`'s level; `w`, `a`, `y` must have the
/// lengths above.
pub(super) unsafe fn matmul<F: TiledFormat>(w: &[u8], n_out: usize, nb: usize, a: &[BlockQ8K], n_rows: usize, y: &mut [f32], fallback: Kernel<BlockQ8K>) {
    let row_bytes = nb * F::BYTES;
    debug_assert_eq!(w.len(), n_out * row_bytes);
    debug_assert_eq!(a.len(), n_rows * nb);
    debug_assert_eq!(y.len(), n_rows * n_out);
    let aux = F::aux(a);
    let panels = n_out.div_ceil(PANEL);
    let threads = rayon::current_num_threads().max(1);
    // Panel tasks first (each repacks its panels once, at most PANEL_BYTES of them: an LM head
    // of 151,936 rows would otherwise repack tens of MB per task); rows split only when panels
    // are few.
    let most = (PANEL_BYTES / (nb * core::mem::size_of::<F::Panel>())).max(1);
    let per_task = panels.div_ceil(4 * threads).clamp(1, most);
    let p_tasks = panels.div_ceil(per_task);
    let r_tasks = if p_tasks >= 2 * threads { 1 } else { (2 * threads).div_ceil(p_tasks).min(n_rows.div_ceil(4 * TILE_ROWS)) };
    let row_block = n_rows.div_ceil(r_tasks);
    let r_tasks = n_rows.div_ceil(row_block);
    let chunk = (CHUNK_BYTES / (nb * core::mem::size_of::<BlockQ8K>())).max(MAX_ROWS) / MAX_ROWS * MAX_ROWS;
    let yp = OutPtr(y.as_mut_ptr());
    let task = |id: usize| {
        #[allow(clippy::redundant_locals)]
        let yp = yp;
        let (pt, rt) = (id % p_tasks, id / p_tasks);
        let (r0, r1) = (rt * row_block, ((rt + 1) * row_block).min(n_rows));
        let (p0, p1) = (pt * per_task, ((pt + 1) * per_task).min(panels));
        with_panels(nb * (p1 - p0), F::ZERO, |buf| {
            for pi in p0..p1 {
                let o = pi * PANEL;
                // SAFETY: the caller guarantees the format's CPU features.
                unsafe { F::repack(&w[o * row_bytes..], row_bytes, PANEL.min(n_out - o), nb, &mut buf[(pi - p0) * nb..]) };
            }
            for c0 in (r0..r1).step_by(chunk) {
                let c1 = (c0 + chunk).min(r1);
                for pi in p0..p1 {
                    let (o, panel) = (pi * PANEL, buf[(pi - p0) * nb..].as_ptr());
                    let cols = PANEL.min(n_out - o);
                    let mut r = c0;
                    while r < c1 {
                        // A run of rows of one mode: at most a tile, or MAX_ROWS for the fallback.
                        let mode = F::mode(a[r * nb].row);
                        let most = if mode.is_some() { TILE_ROWS } else { MAX_ROWS };
                        let mut nr = 1;
                        while nr < most && r + nr < c1 && F::mode(a[(r + nr) * nb].row) == mode {
                            nr += 1;
                        }
                        let ar = a.as_ptr().add(r * nb);
                        match mode {
                            // SAFETY: `panel` holds nb panels; rows r..r+nr < n_rows of `a`/`aux` (nb
                            // each; `aux` only read where the format makes it); y's rows r..r+nr,
                            // columns o..o+cols are inside `y` and this task's alone; the caller
                            // guarantees the CPU features.
                            Some(m) => unsafe { F::tile(m, nr, panel, nb, ar, aux.as_ptr().wrapping_add(r * nb), yp.0.add(r * n_out + o), n_out, cols) },
                            None => {
                                let mut out = [0.0f32; MAX_W * MAX_ROWS];
                                for j0 in (0..cols).step_by(MAX_W) {
                                    let nw = MAX_W.min(cols - j0);
                                    // SAFETY: weight rows o+j0..o+j0+nw < n_out are whole rows of `w`,
                                    // `nr` ≤ MAX_ROWS activation rows of nb blocks, `out` has
                                    // MAX_W·MAX_ROWS slots; the caller guarantees the kernel's level.
                                    unsafe { fallback(w.as_ptr().add((o + j0) * row_bytes), row_bytes, nw, ar, nb, nb, nr, out.as_mut_ptr()) };
                                    for j in 0..nw {
                                        for i in 0..nr {
                                            // SAFETY: inside `y`, this task's tile only (as above).
                                            unsafe { *yp.0.add((r + i) * n_out + o + j0 + j) = out[j * MAX_ROWS + i] };
                                        }
                                    }
                                }
                            }
                        }
                        r += nr;
                    }
                }
            }
        });
    };
    let n_tasks = p_tasks * r_tasks;
    if n_tasks == 1 {
        task(0);
    } else {
        (0..n_tasks).into_par_iter().for_each(task);
    }
}

