//! Matrix multiplication against a GGUF-block weight (`rust/kernels/mmvq.cu`, `mmq.cu`,
//! `quantize.cu`):
//! - ≤ 8 rows (decode): GEMV, `mmvq_<fmt>_q8_1_c<rows>` on the input's q8_1 copy (made here by
//!   `quantize_f32_q8_1` unless a fused producer already wrote it), or `mmv_<fmt>_f32_c<rows>`
//!   for dense weights;
//! - more rows (prefill, batched decode): the tensor-core GEMM `mmq_<fmt>_f16_n<64|128>`.
//! Bias is added in the kernels' epilogues.

use super::super::launch::Args;
use super::super::{intern, is_dense, kernel_fmt, CudaBackend, CudaBuffer, CudaWeight};
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Rows up to which the GEMV runs (it is instantiated for 1..=8 activation rows).
pub const MMVQ_MAX_ROWS: usize = 8;

impl CudaBackend {
    pub(crate) fn op_matmul(&self, w: &CudaWeight, bias: Option<&CudaWeight>, x: &CudaBuffer, n_rows: usize, out: &mut CudaBuffer) -> Result<()> {
        let (k, n_out) = (w.k(), w.n_out());
        if w.is_vector() {
            return Err(FakError::model(format!("tensor {} is a vector, not a matrix", w.name)));
        }
        let fmt = kernel_fmt(w.wtype).ok_or_else(|| FakError::Unsupported(format!("matmul with {} weights", w.wtype.name())))?;
        let bias_ptr = match bias {
            Some(b) if b.wtype == GgmlType::F32 && b.k() == n_out => b.mem.ptr(),
            Some(b) => return Err(FakError::model(format!("bias {} must be a vector of {n_out} values", b.name))),
            None => 0,
        };
        if n_rows * k > x.len || n_rows * n_out > out.len {
            return Err(FakError::invalid("matmul", format!("{n_rows} rows of {k} → {n_out} exceed the buffers ({} / {})", x.len, out.len)));
        }
        out.written();
        if n_rows == 0 {
            return Ok(());
        }
        if n_rows <= MMVQ_MAX_ROWS {
            // Warps per row by row length (a long row is split across warps so that each warp
            // keeps several 32-value tasks in flight), rows per 128-thread block = 4 / that;
            // small matrices get one row per block, for more blocks.
            let tasks = k / 32;
            let wpr = if tasks >= 256 {
                4
            } else if tasks >= 128 {
                2
            } else {
                1
            };
            let rpb = if n_out < 1024 { 1 } else { 4 / wpr };
            let grid = (n_out.div_ceil(rpb) as u32, 1, 1);
            if is_dense(w.wtype) {
                let name = intern(format!("mmv_{fmt}_f32_c{n_rows}"));
                return self.launch(
                    "mmvq",
                    name,
                    grid,
                    128,
                    0,
                    Args::new().ptr(w.mem.ptr()).u64(w.row_bytes as u64).ptr(x.ptr()).ptr(bias_ptr).ptr(out.ptr()).i32(k as i32).i32(n_out as i32).i32(rpb as i32),
                );
            }
            let need = n_rows * k;
            if x.q8_len.get() < need {
                let warps = need / 32;
                self.launch(
                    "quantize",
                    "quantize_f32_q8_1",
                    (warps.div_ceil(8).clamp(1, 8192) as u32, 1, 1),
                    256,
                    0,
                    Args::new().ptr(x.ptr()).ptr(x.q8_qs()).ptr(x.q8_ds()).i32(need as i32),
                )?;
                x.q8_len.set(need);
            }
            let name = intern(format!("mmvq_{fmt}_q8_1_c{n_rows}"));
            return self.launch(
                "mmvq",
                name,
                grid,
                128,
                0,
                Args::new().ptr(w.mem.ptr()).u64(w.row_bytes as u64).ptr(x.q8_qs()).ptr(x.q8_ds()).ptr(bias_ptr).ptr(out.ptr()).i32(k as i32).i32(n_out as i32).i32(rpb as i32),
            );
        }
        let bn = if n_rows <= 64 { 64 } else { 128 };
        let name = intern(format!("mmq_{fmt}_f16_n{bn}"));
        self.launch(
            "mmq",
            name,
            (n_out.div_ceil(128) as u32, n_rows.div_ceil(bn) as u32, 1),
            256,
            0,
            Args::new().ptr(w.mem.ptr()).u64(w.row_bytes as u64).ptr(x.ptr()).ptr(bias_ptr).ptr(out.ptr()).i32(k as i32).i32(n_out as i32).i32(n_rows as i32),
        )
    }
}
