//! Attention (`rust/kernels/fattn.cu`): flash attention on tensor cores over the paged f16 KV
//! cache.
//!
//! Decode batches (every sequence has one new row): one warp-group of ⌈G/16⌉ warps per
//! (sequence, KV head), the KV range split into `n_split` pieces so that about two waves of
//! blocks cover the GPU. The number of splits is fixed per batch size (a captured decode graph
//! stays valid as sequences grow); each sequence's current range is cut into that many pieces
//! of whole tiles (at least 64 positions) by the kernel itself, so a short context in a batch
//! sized for 128k still keeps every split busy. (Before 2026-12-06 the pieces were cut from the
//! context capacity: a 32k context in a 128k engine filled a quarter of them and decoded at 0.71
//! of the speed; `FAK_CUDA_ATTN_SPLIT=capacity` restores that rule.) A separate kernel (or, with
//! `FAK_CUDA_SAFE`, the last block to finish) combines the partial softmaxes.
//! Prefill: four warps (64 (row, head) pairs) per block, no split.
//!
//! Head dimension 256 (the Qwen3.5/3.6 hybrids' gated attention, Gemma): Q's fragments are read
//! from shared memory at each k-step instead of being held in registers (the f32 O accumulator
//! alone takes 128 registers per thread), so Q's rows sit beside the K/V double buffer:
//! 74/83/99 KiB per block for 1/2/4 warps, above the default 48 KiB (the launch raises the
//! function's limit). Prefill drops to fewer warps on a GPU whose limit is lower.
//!
//! Sliding window ([`AttnParams::window`], `W`): the kernel computes each row's window start from
//! its position and starts at the tile holding it, so no key outside the window is loaded and the
//! blocks before it may be released. A decode row's range is then at most `W + 31` positions (the
//! window plus the alignment to a 32-token tile), counted from that tile, and the number of
//! splits is sized for that span instead of the batch's context capacity (fixed per layer, so
//! captured decode graphs stay valid).

use super::super::launch::Args;
use super::super::{intern, AttnScratch, CudaBackend, CudaBatch, CudaBuffer, CudaKvCache, MEMORY};
use crate::backend::AttnParams;
use crate::{FakError, Result};

/// `FAK_CUDA_ATTN_SPLIT=capacity`: decode splits cut the batch's context capacity into equal
/// ranges (the rule before 2026-12-06), instead of each sequence's own range.
fn split_by_capacity() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FAK_CUDA_ATTN_SPLIT").as_deref() == Ok("capacity"))
}

/// Head dimensions with a compiled attention kernel.
pub const HEAD_DIMS: [usize; 7] = [16, 32, 64, 80, 96, 128, 256];

/// Static shared memory of the attention kernels (`s_last`, as ptxas reports it).
const FATTN_STATIC_SMEM: usize = 16;

/// Dynamic shared memory of `fattn_f16_d{d}_w{nw}` launched with `n_split` splits: the K/V double
/// buffer (4 tiles of 32 rows of `d + 8` halves), beside it the warps' `16·nw` rows of Q when
/// `d > 128` (the kernel's `QS`; smaller Q pass through the K/V space into registers), or the
/// in-kernel combine's per-(pair, split) weights if larger.
pub(crate) fn fattn_smem(d: usize, nw: usize, n_split: usize) -> usize {
    let pairs = 16 * nw;
    let q_rows = if d > 128 { pairs } else { 0 };
    ((q_rows + 128) * (d + 8) * 2).max(pairs * (n_split + 1) * 4)
}

impl CudaBackend {
    /// Whether `fattn_f16_d{d}_w{nw}` with `n_split` splits fits the GPU's shared memory per block.
    fn fattn_fits(&self, d: usize, nw: usize, n_split: usize) -> bool {
        fattn_smem(d, nw, n_split) + FATTN_STATIC_SMEM <= self.dev.info.max_smem_optin.max(0) as usize
    }

    /// The split workspace (`ws_o` then `ws_ml`) of at least `bytes`; never shrinks, old ones stay
    /// alive for graphs captured with them.
    fn attn_workspace(&self, bytes: usize) -> Result<u64> {
        let mut g = self.attn.lock().unwrap_or_else(|e| e.into_inner());
        let s: &mut AttnScratch = &mut g;
        if s.ws_bytes < bytes {
            let t = self.alloc_tracked(bytes, &MEMORY.activations)?;
            if let Some(old) = s.ws.replace(t) {
                s.old.push(old);
            }
            s.ws_bytes = bytes;
        }
        Ok(s.ws.as_ref().expect("allocated above").ptr())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_attention(&self, q: &CudaBuffer, cache: &CudaKvCache, layer: usize, batch: &CudaBatch, n_rows: usize, p: &AttnParams, out: &mut CudaBuffer) -> Result<()> {
        out.written();
        let d = p.head_dim;
        if !HEAD_DIMS.contains(&d) || cache.layout.head_dim != d || p.n_head_kv == 0 || p.n_head % p.n_head_kv != 0 {
            return Err(FakError::Unsupported(format!(
                "CUDA attention for head_dim {d} (compiled: {HEAD_DIMS:?}) with {} heads / {} KV heads",
                p.n_head, p.n_head_kv
            )));
        }
        let plan = &batch.plan;
        let n_seqs = plan.seqs.len();
        if n_seqs == 0 || n_rows == 0 {
            return Ok(());
        }
        let g = p.n_head / p.n_head_kv;
        let n_kv = p.n_head_kv;
        let scale_log2 = p.scale * std::f32::consts::LOG2_E;
        // 0: no window (the kernels' convention); a window past i32 covers any context.
        let window = p.window.map_or(0, |w| w.min(i32::MAX as u32) as i32);
        let decode = plan.seqs.iter().all(|s| s.n_rows == 1) && g <= 64;
        let (nw, tiles_per_seq, n_split, split_len) = if decode {
            let nw = match g.div_ceil(16) {
                1 => 1,
                2 => 2,
                _ => 4,
            };
            // Positions one split range must cover: the context capacity, or with a window the
            // window's tiles (a decode row's keys lie in [base, L) with L − base ≤ W + 31).
            let max_ctx = (batch.limits.max_blocks_per_seq * 32).max(32);
            let max_ctx = match p.window {
                Some(w) => max_ctx.min(w as usize + 31),
                None => max_ctx,
            };
            let sms = self.dev.info.n_sm.max(1) as usize;
            let want = (2 * sms).div_ceil(n_seqs * n_kv).max(1);
            let n_split = want.min(max_ctx.div_ceil(64)).clamp(1, 128);
            if split_by_capacity() {
                let split_len = max_ctx.div_ceil(n_split).next_multiple_of(32);
                (nw, 1, max_ctx.div_ceil(split_len), split_len)
            } else {
                // 0: each sequence's range over the n_split splits (`kv_split_len` in fattn.cu)
                (nw, 1, n_split, 0)
            }
        } else {
            // Four warps, or fewer where their shared memory does not fit (d = 256 on a GPU with
            // 99 KiB per block).
            let nw = [4, 2, 1].into_iter().find(|&nw| self.fattn_fits(d, nw, 1)).unwrap_or(1);
            let max_rows = plan.seqs.iter().map(|s| s.n_rows as usize).max().unwrap_or(0);
            (nw, (max_rows * g).div_ceil(16 * nw), 1, 1 << 30)
        };
        if !self.fattn_fits(d, nw, n_split) {
            return Err(FakError::Unsupported(format!(
                "CUDA attention for head_dim {d} with {g} query heads per KV head: {} bytes of shared memory per block, the GPU has {}",
                fattn_smem(d, nw, n_split) + FATTN_STATIC_SMEM,
                self.dev.info.max_smem_optin
            )));
        }
        let pairs = 16 * nw;
        let (ws_o, ws_ml) = if n_split > 1 {
            let recs = n_seqs * n_kv * n_split * pairs;
            let o_bytes = (recs * d * 4).next_multiple_of(256);
            let base = self.attn_workspace(o_bytes + recs * 8)?;
            (base, base + o_bytes as u64)
        } else {
            (0, 0)
        };
        if n_split > 1 && n_seqs * n_kv > batch.counters_len {
            return Err(FakError::invalid("batch", format!("{n_seqs} sequences × {n_kv} KV heads exceed the attention counters ({})", batch.counters_len)));
        }
        let smem = fattn_smem(d, nw, n_split) as u32;
        let name = intern(format!("fattn_f16_d{d}_w{nw}"));
        // Decode splits are combined by a separate kernel (parallel over query heads) unless
        // FAK_CUDA_SAFE asks for the in-kernel combine by the last block.
        let ext_combine = decode && n_split > 1 && !super::super::safe_kernels();
        self.launch(
            "fattn",
            name,
            ((n_seqs * tiles_per_seq) as u32, n_kv as u32, n_split as u32),
            (32 * nw) as u32,
            smem,
            Args::new()
                .ptr(q.ptr())
                .ptr(cache.k_layer(layer))
                .ptr(cache.v_layer(layer))
                .ptr(batch.seqs())
                .ptr(batch.tables())
                .ptr(out.ptr())
                .ptr(ws_o)
                .ptr(ws_ml)
                .ptr(batch.counters.ptr())
                .i32(p.n_head as i32)
                .i32(n_kv as i32)
                .i32(tiles_per_seq as i32)
                .i32(split_len.min(i32::MAX as usize) as i32)
                .f32(scale_log2)
                .i32(ext_combine as i32)
                .i32(window),
        )?;
        if ext_combine {
            self.launch(
                "fattn",
                "fattn_combine_f32",
                (n_seqs as u32, p.n_head as u32, 1),
                256,
                0,
                Args::new()
                    .ptr(batch.seqs())
                    .ptr(ws_o)
                    .ptr(ws_ml)
                    .ptr(out.ptr())
                    .i32(p.n_head as i32)
                    .i32(n_kv as i32)
                    .i32(n_split as i32)
                    .i32(split_len as i32)
                    .i32(pairs as i32)
                    .i32(d as i32)
                    .i32(window),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fattn_smem_per_variant() {
        // d ≤ 128: Q passes through the K/V double buffer (the rule before head_dim 256).
        for d in [16, 32, 64, 80, 96, 128] {
            for nw in [1, 2, 4] {
                assert_eq!(fattn_smem(d, nw, 1), 128 * (d + 8) * 2);
                assert!(fattn_smem(d, nw, 1) + FATTN_STATIC_SMEM <= 48 * 1024, "d {d}: within the default limit");
            }
        }
        // d = 256: Q's rows beside the K/V tiles; the in-kernel combine's weights of 128 splits fit.
        assert_eq!([1, 2, 4].map(|nw| fattn_smem(256, nw, 128)), [76032, 84480, 101376]);
        // A 99 KiB GPU (sm_86/89) takes two warps, not four.
        let optin = 99 * 1024;
        assert!(fattn_smem(256, 2, 128) + FATTN_STATIC_SMEM <= optin);
        assert!(fattn_smem(256, 4, 1) + FATTN_STATIC_SMEM > optin);
    }
}
