//! The experts of `--cpu-moe` / `--n-cpu-moe` layers, whose blocks stay in host memory (the
//! file's map; [`HostBlocks`]):
//! - few rows (decode, below [`UPLOAD_MIN_ROWS`]): the CPU backend computes the chosen experts —
//!   a few experts' rows read where they lie beat copying the layer's 128;
//! - many rows (prefill, large batches; opt-in until run on a GPU: [`upload_min_rows_from_env`]):
//!   the layer's three expert tensors are copied to the GPU
//!   and the GPU's expert kernels run on the copies, as llama.cpp does for weights in host memory
//!   at batches of 32 rows and more. The copies go on a stream of their own into two staging
//!   slots used in turn, so that one layer's upload overlaps the layers before it; events order
//!   a slot's upload after the kernels that read its previous layer, and those kernels after
//!   the upload. The host pages are page-locked where allowed (`HostBlocks::pinned`): a DMA
//!   at the link's speed instead of the driver's staged copy from pageable memory.
//!
//! Neither path is captured in a CUDA graph: the forward of a model with host experts runs
//! its launches directly (`model/forward.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::super::copy::{CopyStream, Event};
use super::super::{CudaBackend, CudaBuffer, CudaWeight, HostBlocks, Tracked, MEMORY};
use crate::backend::{MoeBuffers, MoeParams, MoeWeights};
use crate::{FakError, Result};

/// Rows of a forward from which a host layer's experts are uploaded and run on the GPU when
/// the upload is on (llama.cpp: `GGML_OP_OFFLOAD_MIN_BATCH`, 32).
pub const UPLOAD_MIN_ROWS: usize = 32;

/// The rows from which a backend made now uploads host experts: `FAK_MOE_UPLOAD_MIN_ROWS` (read
/// when the backend is made, so that a test or bench can set it per engine). Unset: **off**
/// (`usize::MAX`, the CPU computes every row) until the path has run on a GPU — written
/// 2026-12-08 in a session that got no GPU; `FAK_MOE_UPLOAD_MIN_ROWS=32` (= [`UPLOAD_MIN_ROWS`])
/// turns it on, as the op tests and `benches/bench_cuda_cpu_moe.py` do.
pub(crate) fn upload_min_rows_from_env() -> usize {
    std::env::var("FAK_MOE_UPLOAD_MIN_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX)
}

/// Bytes of host experts copied to the GPU so far, process-wide (`fak.cuda_memory()`).
pub static EXPERT_UPLOAD_BYTES: AtomicUsize = AtomicUsize::new(0);

/// One staging slot: device copies of a layer's gate, up and down experts (each grown to the
/// largest seen), the event after their upload and the event after the kernels that read them.
struct Slot {
    w: [Option<CudaWeight>; 3],
    uploaded: Event,
    consumed: Event,
}

/// The copy stream and the two staging slots (made on first use).
#[derive(Default)]
pub(crate) struct ExpertStaging {
    copy: Option<CopyStream>,
    slots: Vec<Slot>,
    next: usize,
}

impl CudaBackend {
    /// The experts of a host layer for `n_rows` rows: on the GPU from staged copies at
    /// `moe_upload_min_rows` rows and more ([`upload_min_rows_from_env`]), else on the CPU.
    pub(super) fn moe_host_experts(&self, h: &CudaBuffer, w: &MoeWeights<'_, CudaWeight>, p: &MoeParams, n_rows: usize, s: MoeBuffers<'_, CudaBuffer>, res: &mut CudaBuffer) -> Result<()> {
        if n_rows < self.moe_upload_min_rows {
            return self.moe_experts_on_cpu(h, w, p, n_rows, s, res);
        }
        let mut g = self.moe_staging.lock().unwrap_or_else(|e| e.into_inner());
        let st: &mut ExpertStaging = &mut g;
        if st.copy.is_none() {
            st.copy = Some(CopyStream::new(&self.dev)?);
            for _ in 0..2 {
                st.slots.push(Slot { w: [None, None, None], uploaded: Event::new(&self.dev)?, consumed: Event::new(&self.dev)? });
            }
        }
        let copy = st.copy.as_ref().expect("made above");
        let i = st.next;
        st.next = (i + 1) % st.slots.len();
        let slot = &mut st.slots[i];
        // the upload waits for the kernels that read this slot's previous layer
        slot.consumed.wait_on(copy.stream)?;
        for (dst, src) in slot.w.iter_mut().zip([w.gate_exps, w.up_exps, w.down_exps]) {
            self.upload_experts(copy, dst, src)?;
        }
        slot.uploaded.record(copy.stream)?;
        slot.uploaded.wait_on(self.dev.stream)?;
        let [g_, u_, d_] = &slot.w;
        let staged = MoeWeights { gate_inp: w.gate_inp, gate_exps: g_.as_ref().expect("uploaded"), up_exps: u_.as_ref().expect("uploaded"), down_exps: d_.as_ref().expect("uploaded") };
        let r = self.moe_experts_on_gpu(h, &staged, p, n_rows, s, res);
        slot.consumed.record(self.dev.stream)?;
        r
    }

    /// Queues the copy of host tensor `src` into the staging weight `dst` (grown when too small:
    /// after both streams drained, since queued kernels may still read the old allocation).
    fn upload_experts(&self, copy: &CopyStream, dst: &mut Option<CudaWeight>, src: &CudaWeight) -> Result<()> {
        let hb: &HostBlocks = src.host.as_ref().ok_or_else(|| FakError::model(format!("{}: a layer's experts must all be on the host or all on the device", src.name)))?;
        let bytes = hb.bytes();
        if dst.as_ref().is_none_or(|d| d.mem.mem.len() < bytes.len()) {
            self.dev.synchronize()?;
            copy.synchronize()?;
            *dst = None;
            let mem = Tracked::new(self.dev.alloc(bytes.len())?, &MEMORY.activations);
            *dst = Some(CudaWeight { name: String::new(), wtype: src.wtype, dims: Vec::new(), row_bytes: 0, mem, host: None });
        }
        let d = dst.as_mut().expect("allocated above");
        d.name.clone_from(&src.name);
        d.wtype = src.wtype;
        d.dims.clone_from(&src.dims);
        d.row_bytes = src.row_bytes;
        // Pageable head, page-locked middle, pageable tail: a copy that touches pageable bytes
        // is staged by the driver as a whole, so the locked pages go in a copy of their own.
        let (off, len) = hb.pinned_span();
        for (a, b) in [(0, off), (off, off + len), (off + len, bytes.len())] {
            // SAFETY: the bytes are the file's read-only map, alive while `src` (a weight of the
            // model that runs this forward) lives — longer than any copy queued here.
            unsafe { copy.copy_to_device(&d.mem.mem, a, bytes.as_ptr().add(a), b - a)? };
        }
        EXPERT_UPLOAD_BYTES.fetch_add(bytes.len(), Ordering::Relaxed);
        Ok(())
    }

    /// Copies the first `out.len()` values of `buf` to the host after the queued work finished.
    fn read_f32_sync(&self, buf: &CudaBuffer, out: &mut [f32]) -> Result<()> {
        self.dev.synchronize()?;
        buf.mem.mem.read(0, out)
    }

    /// The experts of a host layer on the CPU: the rows `h`, the chosen ids and weights come to
    /// the host (one synchronisation), the CPU backend's expert matmuls, SwiGLU and weighted sum
    /// (`cpu::moe`, the same arithmetic as the CPU backend) make `Σ_s w_s·FFN_{e_s}`, which goes
    /// back into `s.experts` and is added to `res` on the device.
    fn moe_experts_on_cpu(&self, h: &CudaBuffer, w: &MoeWeights<'_, CudaWeight>, p: &MoeParams, n_rows: usize, s: MoeBuffers<'_, CudaBuffer>, res: &mut CudaBuffer) -> Result<()> {
        use crate::backend::cpu::{moe as cmoe, vecops};
        let (k, d, f) = (p.k, p.n_embd, p.n_ff_exp);
        fn host(wt: &CudaWeight) -> Result<cmoe::ExpertMatmul<'_>> {
            let hb = wt.host.as_ref().ok_or_else(|| FakError::model(format!("{}: a layer's experts must all be on the host or all on the device", wt.name)))?;
            Ok(cmoe::ExpertMatmul { wtype: wt.wtype, w: hb.bytes(), k_in: wt.dims[0], n_out: wt.dims[1], n_expert: wt.dims[2] })
        }
        let (gate, up, down) = (host(w.gate_exps)?, host(w.up_exps)?, host(w.down_exps)?);
        let mut hx = vec![0f32; n_rows * d];
        let mut ids = vec![0f32; n_rows * k];
        let mut ws = vec![0f32; n_rows * k];
        self.read_f32_sync(h, &mut hx)?;
        self.read_f32_sync(s.ids, &mut ids)?;
        self.read_f32_sync(s.weights, &mut ws)?;
        let mut g = vec![0f32; n_rows * k * f];
        let mut u = vec![0f32; n_rows * k * f];
        let mut e = vec![0f32; n_rows * k * d];
        up.run(&hx, false, &ids, k, None, &mut u)?;
        gate.run(&hx, false, &ids, k, None, &mut g)?;
        vecops::swiglu(&mut g, &u);
        down.run(&g, true, &ids, k, None, &mut e)?;
        let mut moe_out = vec![0f32; n_rows * d];
        cmoe::combine(&e, &ws, n_rows, k, d, &mut moe_out);
        s.experts.written();
        s.experts.mem.mem.write(0, &moe_out)?;
        self.op_add(res, s.experts, n_rows * d)
    }
}
