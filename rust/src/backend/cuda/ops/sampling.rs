//! Argmax and the greedy step on the device (`rust/kernels/sampling.cu`): only the winning ids
//! (and their log-probabilities) come back to the host; and the device sampling's candidates,
//! penalties and whole-row draws.

use super::super::launch::Args;
use super::super::{CudaBackend, CudaBuffer};
use crate::backend::{DrawRequest, DrawnRows, LogitPenalty, TopRows};
use crate::Result;

impl CudaBackend {
    pub(crate) fn op_argmax(&self, x: &CudaBuffer, n_rows: usize, n_cols: usize, out: &mut [u32]) -> Result<()> {
        if n_rows == 0 {
            return Ok(());
        }
        let dst = self.small_scratch(n_rows * 4)?;
        self.launch("sampling", "argmax_f32", (n_rows as u32, 1, 1), 1024, 0, Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(dst).ptr(0))?;
        let g = self.small.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().expect("scratch allocated above").mem.read(0, &mut out[..n_rows])
    }

    /// The greedy step: argmax and its log-softmax per row on the device (`greedy_partial_f32`
    /// over slices of the row, then `greedy_final_f32`); one copy of `2 · n_rows` numbers comes
    /// back.
    pub(crate) fn op_greedy(&self, x: &CudaBuffer, n_rows: usize, n_cols: usize, tokens: &mut [u32], logprobs: &mut [f32]) -> Result<()> {
        if n_rows == 0 {
            return Ok(());
        }
        if n_rows * n_cols > x.len || tokens.len() < n_rows || logprobs.len() < n_rows {
            return Err(crate::FakError::invalid("greedy_rows", format!("{n_rows} rows of {n_cols} exceed the buffers")));
        }
        // Slices of ≥ 1024 columns, at most 128 per row; the partials (16 bytes each) follow the
        // 2 · n_rows results in the scratch, 16-byte aligned.
        let slices = n_cols.div_ceil(1024).clamp(1, 128);
        let part_off = (8 * n_rows).next_multiple_of(16);
        let dst = self.small_scratch(part_off + 16 * slices * n_rows)?;
        let part = dst + part_off as u64;
        self.launch("sampling", "greedy_partial_f32", (slices as u32, n_rows as u32, 1), 256, 0, Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(part))?;
        self.launch("sampling", "greedy_final_f32", (n_rows as u32, 1, 1), 32, 0, Args::new().ptr(part).i32(slices as i32).ptr(dst).ptr(dst + 4 * n_rows as u64))?;
        let mut both = vec![0u32; 2 * n_rows];
        let g = self.small.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().expect("scratch allocated above").mem.read(0, &mut both)?;
        tokens[..n_rows].copy_from_slice(&both[..n_rows]);
        for (l, b) in logprobs[..n_rows].iter_mut().zip(&both[n_rows..]) {
            *l = f32::from_bits(*b);
        }
        Ok(())
    }
}

/// Byte offsets in the small scratch: `n` items of `size` bytes after `at`, 16-byte aligned.
fn region(at: &mut usize, n: usize, size: usize) -> usize {
    let o = at.next_multiple_of(16);
    *at = o + n * size;
    o
}

/// Reads `out.len()` items at byte offset `o` of the small scratch (after the queued work).
fn read_scratch<T: Copy>(be: &CudaBackend, o: usize, out: &mut [T]) -> Result<()> {
    let g = be.small.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().expect("scratch allocated").mem.read(o, out)
}

/// Little-endian words of a byte copy of the scratch that starts at byte offset `start`.
struct Bytes {
    start: usize,
    b: Vec<u8>,
}

impl Bytes {
    fn u32(&self, o: usize) -> u32 {
        u32::from_le_bytes(self.b[o - self.start..o - self.start + 4].try_into().expect("4 bytes"))
    }
    fn f32(&self, o: usize) -> f32 {
        f32::from_bits(self.u32(o))
    }
    fn f64(&self, o: usize) -> f64 {
        f64::from_le_bytes(self.b[o - self.start..o - self.start + 8].try_into().expect("8 bytes"))
    }
}

/// The scratch bytes `[start, end)`, in one copy (after the queued work).
fn read_bytes(be: &CudaBackend, start: usize, end: usize) -> Result<Bytes> {
    let mut b = vec![0u8; end - start];
    read_scratch(be, start, &mut b)?;
    Ok(Bytes { start, b })
}

fn write_scratch<T: Copy>(be: &CudaBackend, o: usize, data: &[T]) -> Result<()> {
    let g = be.small.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().expect("scratch allocated").mem.write(o, data)
}

impl CudaBackend {
    /// `top_rows_f32`, one block per selected row; ids, values, sums, maxima and flags come back
    /// in one copy.
    pub(crate) fn op_top_rows(&self, x: &CudaBuffer, n_cols: usize, rows: &[u32], m: usize, out: &mut TopRows) -> Result<()> {
        let n = rows.len();
        out.reset(n, m);
        if n == 0 {
            return Ok(());
        }
        if m == 0 || m > 1024 || m > n_cols || rows.iter().any(|&r| (r as usize + 1) * n_cols > x.len) {
            return Err(crate::FakError::invalid("top_rows", format!("top {m} of rows {rows:?} of {n_cols} in a buffer of {}", x.len)));
        }
        let mut at = 0;
        let o_rows = region(&mut at, n, 4);
        let o_ids = region(&mut at, n * m, 4);
        let o_vals = region(&mut at, n * m, 4);
        let o_z = region(&mut at, n, 8);
        let o_max = region(&mut at, n, 4);
        let o_exact = region(&mut at, n, 4);
        let base = self.small_scratch(at)?;
        write_scratch(self, o_rows, rows)?;
        let p = |o: usize| base + o as u64;
        self.launch(
            "sampling",
            "top_rows_f32",
            (n as u32, 1, 1),
            1024,
            0,
            Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(p(o_rows)).i32(m as i32).ptr(p(o_ids)).ptr(p(o_vals)).ptr(p(o_z)).ptr(p(o_max)).ptr(p(o_exact)),
        )?;
        // One copy of everything from the ids on.
        let bytes = read_bytes(self, o_ids, at)?;
        for i in 0..n * m {
            out.ids[i] = bytes.u32(o_ids + 4 * i);
            out.vals[i] = bytes.f32(o_vals + 4 * i);
        }
        for r in 0..n {
            out.z[r] = bytes.f64(o_z + 8 * r);
            out.max[r] = bytes.f32(o_max + 4 * r);
            out.exact[r] = bytes.u32(o_exact + 4 * r) != 0;
        }
        Ok(())
    }

    /// `penalize_f32`, one thread per entry.
    pub(crate) fn op_penalize(&self, x: &mut CudaBuffer, n_cols: usize, pens: &[LogitPenalty], raw: &mut [f32]) -> Result<()> {
        let n = pens.len();
        if n == 0 {
            return Ok(());
        }
        if raw.len() < n || pens.iter().any(|p| p.token as usize >= n_cols || (p.row as usize + 1) * n_cols > x.len) {
            return Err(crate::FakError::invalid("penalize", format!("{n} penalties outside rows of {n_cols} in a buffer of {}", x.len)));
        }
        let mut at = 0;
        let o_pen = region(&mut at, n, std::mem::size_of::<LogitPenalty>());
        let o_raw = region(&mut at, n, 4);
        let base = self.small_scratch(at)?;
        write_scratch(self, o_pen, pens)?;
        let blocks = n.div_ceil(256) as u32;
        self.launch("sampling", "penalize_f32", (blocks, 1, 1), 256, 0, Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(base + o_pen as u64).i32(n as i32).ptr(base + o_raw as u64))?;
        read_scratch(self, o_raw, &mut raw[..n])
    }

    /// `draw_partial_f32` over slices of each row (grid: slices × draws), then
    /// `draw_final_f32`, one block per draw; tokens, logits, maxima and sums come back in one copy.
    pub(crate) fn op_draw(&self, x: &CudaBuffer, n_cols: usize, draws: &[DrawRequest], out: &mut DrawnRows) -> Result<()> {
        let n = draws.len();
        out.reset(n);
        if n == 0 {
            return Ok(());
        }
        if draws.iter().any(|d| (d.row as usize + 1) * n_cols > x.len) {
            return Err(crate::FakError::invalid("draw", format!("{n} draws outside rows of {n_cols} in a buffer of {}", x.len)));
        }
        // Slices of ≥ 1024 columns, at most 128 per row (as the greedy step).
        let slices = n_cols.div_ceil(1024).clamp(1, 128);
        let mut at = 0;
        let o_req = region(&mut at, n, std::mem::size_of::<DrawRequest>());
        let o_part = region(&mut at, n * slices, 24);
        let o_tok = region(&mut at, n, 4);
        let o_val = region(&mut at, n, 4);
        let o_max = region(&mut at, n, 4);
        let o_z = region(&mut at, n, 8);
        let base = self.small_scratch(at)?;
        write_scratch(self, o_req, draws)?;
        let p = |o: usize| base + o as u64;
        self.launch("sampling", "draw_partial_f32", (slices as u32, n as u32, 1), 256, 0, Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(p(o_req)).ptr(p(o_part)))?;
        self.launch(
            "sampling",
            "draw_final_f32",
            (n as u32, 1, 1),
            1024,
            0,
            Args::new().ptr(x.ptr()).i32(n_cols as i32).ptr(p(o_req)).ptr(p(o_part)).i32(slices as i32).ptr(p(o_tok)).ptr(p(o_val)).ptr(p(o_max)).ptr(p(o_z)),
        )?;
        let bytes = read_bytes(self, o_tok, at)?;
        for i in 0..n {
            out.tokens[i] = bytes.u32(o_tok + 4 * i);
            out.vals[i] = bytes.f32(o_val + 4 * i);
            out.max[i] = bytes.f32(o_max + 4 * i);
            out.z[i] = bytes.f64(o_z + 8 * i);
        }
        Ok(())
    }
}
