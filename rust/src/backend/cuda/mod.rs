//! The CUDA backend: fak's own kernels (`rust/kernels/*.cu`) on an NVIDIA GPU through cudarc's
//! driver API (no cuBLAS, cuDNN or runtime library). The driver and NVRTC libraries are loaded at
//! run time, so the extension builds and imports on machines without CUDA.
//!
//! Parts: [`device`] (context, stream, memory), [`copy`] (a copy stream, events, host memory
//! page-locked in place), [`module`] (kernel images: embedded cubins,
//! NVRTC with a disk cache, PTX JIT), [`graph`] (decode graphs), [`launch`] (argument packing),
//! and `ops/<family>.rs`, one file per kernel family, each implementing its ops of the
//! [`Backend`] trait.
//!
//! Data on the device: weights in their GGUF block formats (1-D tensors widened to f32, as on
//! CPU); activations as f32 buffers, each with a side area for its q8_1 form (written by fused
//! producers such as RMSNorm and SwiGLU and consumed by the GEMV); the paged KV cache in f16 with
//! the CPU backend's layout; the batch in persistent device buffers refreshed by one copy per
//! forward.

pub mod copy;
pub mod device;
pub mod graph;
pub mod launch;
pub mod module;
mod ops;
pub use ops::matmul_plan;

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use device::{Device, DeviceInfo};
pub(crate) use ops::EXPERT_UPLOAD_BYTES;
pub use module::{ImageOrigin, Kernels};

use crate::backend::{AttnParams, Backend, BatchLimits, BatchPlan, GraphKey, HostTensor, KvLayout, RopeParams};
use crate::quant::GgmlType;
use crate::{FakError, Result};
use device::{backend_err, DevMem, PinnedMem};

/// Device memory fak holds, by kind (process-wide; bytes).
pub struct MemoryReport {
    pub weights: AtomicUsize,
    pub kv_cache: AtomicUsize,
    pub activations: AtomicUsize,
}

/// The process-wide VRAM counters.
pub static MEMORY: MemoryReport = MemoryReport { weights: AtomicUsize::new(0), kv_cache: AtomicUsize::new(0), activations: AtomicUsize::new(0) };

/// Device memory counted in one [`MEMORY`] field; the count drops with the memory.
pub struct Tracked {
    pub(crate) mem: DevMem,
    counter: &'static AtomicUsize,
}

impl Tracked {
    fn new(mem: DevMem, counter: &'static AtomicUsize) -> Tracked {
        counter.fetch_add(mem.len(), Ordering::Relaxed);
        Tracked { mem, counter }
    }
    #[inline]
    pub fn ptr(&self) -> u64 {
        self.mem.ptr()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.mem.len(), Ordering::Relaxed);
    }
}

/// A weight on the device: a matrix in its GGUF blocks, or a 1-D tensor widened to f32 — or, for
/// the MoE experts of `--cpu-moe` layers, the blocks left in host memory (`host`; `mem` is then
/// a token allocation).
pub struct CudaWeight {
    pub name: String,
    /// Block format of the device bytes (`F32` for widened vectors).
    pub wtype: GgmlType,
    /// Shape in ggml order.
    pub dims: Vec<usize>,
    pub row_bytes: usize,
    pub(crate) mem: Tracked,
    pub(crate) host: Option<HostBlocks>,
}

/// GGUF blocks in host memory (the file's map), kept alive by `owner`; their whole pages
/// page-locked (`pinned`) when [`may_pin`] allows, for uploads at the link's speed.
pub struct HostBlocks {
    ptr: *const u8,
    len: usize,
    // declared before `_owner`: unregistered before the map can go
    pinned: Option<copy::HostRegistration>,
    _owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

// SAFETY: the bytes are immutable for as long as `_owner` (a read-only map) lives, and the owner
// is Send + Sync.
unsafe impl Send for HostBlocks {}
unsafe impl Sync for HostBlocks {}

impl HostBlocks {
    /// The blocks.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` was a valid slice of memory owned by `_owner`, held here.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The page-locked part `(offset, bytes)` of [`Self::bytes`] (`(0, 0)`: none).
    pub fn pinned_span(&self) -> (usize, usize) {
        self.pinned.as_ref().map_or((0, 0), |r| r.span(self.ptr))
    }
}

impl Drop for HostBlocks {
    fn drop(&mut self) {
        HOST_EXPERT_BYTES.fetch_sub(self.len, Ordering::Relaxed);
        if let Some(r) = &self.pinned {
            HOST_EXPERT_PINNED.fetch_sub(r.len(), Ordering::Relaxed);
        }
    }
}

/// Bytes of MoE experts held in host memory (`--cpu-moe`), process-wide.
pub static HOST_EXPERT_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Of those, the bytes page-locked in place.
pub static HOST_EXPERT_PINNED: AtomicUsize = AtomicUsize::new(0);

/// Whether `len` more bytes of host experts may be page-locked: `FAK_MOE_HOST_PIN` = `0`/`off`
/// never, `1`/`on` always; unset, while all of them stay within half the machine's memory
/// (`MemTotal`), so that locking never starves the host (a file larger than that stays pageable,
/// as llama.cpp's map without `--mlock`).
fn may_pin(len: usize) -> bool {
    match std::env::var("FAK_MOE_HOST_PIN").as_deref() {
        Ok("0" | "off" | "false" | "no") => false,
        Ok("1" | "on" | "true" | "yes") => true,
        _ => {
            static TOTAL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
            let total = *TOTAL.get_or_init(|| {
                let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
                let kib = info.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok());
                kib.unwrap_or(0) * 1024
            });
            HOST_EXPERT_PINNED.load(Ordering::Relaxed) + len <= total / 2
        }
    }
}

impl CudaWeight {
    /// Elements per row (`dims[0]`).
    pub fn k(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }
    /// Rows (`dims[1..]` product).
    pub fn n_out(&self) -> usize {
        self.dims.iter().skip(1).product()
    }
    fn is_vector(&self) -> bool {
        self.dims.len() <= 1
    }
}

/// An f32 activation buffer and its side area for the 8-bit forms a quantized matmul reads
/// (`rust/kernels/common.cuh`: the q8_0 form for the legacy formats, the q8_K form for the
/// k-quants, both bit-exact with the CPU backend's activation quantizers).
pub struct CudaBuffer {
    pub(crate) mem: Tracked,
    pub(crate) len: usize,
    /// `qs0` (len i8) | `qsk` (len i8) | `ds0` (len/32 × (f32, f32)) | `dk` (len/256 f32) |
    /// `sk` (len/32 i32), each part 256-byte aligned; offsets in `q8_off`.
    pub(crate) q8: Tracked,
    pub(crate) q8_off: [usize; 5],
    /// How many leading elements have a current q8_0 form (0: none). Every op that writes the
    /// buffer sets it; host-side bookkeeping, identical when a forward is captured or replayed.
    pub(crate) q8_len: Cell<usize>,
    /// The same for the q8_K form.
    pub(crate) q8k_len: Cell<usize>,
}

impl CudaBuffer {
    #[inline]
    pub fn ptr(&self) -> u64 {
        self.mem.ptr()
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Offsets of the side area's parts for a buffer of `n` elements, and its total size.
    fn q8_layout(n: usize) -> ([usize; 5], usize) {
        let up = |b: usize| b.div_ceil(256) * 256;
        let qsk = up(n);
        let ds0 = qsk + up(n);
        let dk = ds0 + up(8 * (n / 32 + 1));
        let sk = dk + up(4 * (n / 256 + 1));
        ([0, qsk, ds0, dk, sk], sk + 4 * (n / 32 + 1))
    }
    /// Device pointers `(qs0, ds0, qsk, dk, sk)`, the argument order of the quantizing kernels.
    pub(crate) fn q8_ptrs(&self) -> [u64; 5] {
        let b = self.q8.ptr();
        let o = self.q8_off;
        [b + o[0] as u64, b + o[2] as u64, b + o[1] as u64, b + o[3] as u64, b + o[4] as u64]
    }
    /// Records that a producer wrote the 8-bit forms of the first `n` elements (the q8_K form
    /// only when `with_k`).
    pub(crate) fn set_q8(&self, n: usize, with_k: bool) {
        self.q8_len.set(n);
        self.q8k_len.set(if with_k { n } else { 0 });
    }
    /// Marks the 8-bit forms stale (the buffer is about to be rewritten by an op without them).
    pub(crate) fn written(&mut self) {
        self.q8_len.set(0);
        self.q8k_len.set(0);
    }
}

/// The paged KV cache: all layers' K (then V) in one allocation each, f16,
/// `[layer][block][kv_head][slot][head_dim]`; and a hybrid model's recurrent state, f32
/// `[state_layer][state_slot][state_len]` (the CPU backend's slot layout, see `ops::deltanet`).
pub struct CudaKvCache {
    pub layout: KvLayout,
    pub(crate) k: Tracked,
    pub(crate) v: Tracked,
    pub(crate) layer_elems: usize,
    /// The recurrent state (`None` without recurrent layers), counted as KV cache memory.
    pub(crate) state: Option<Tracked>,
}

impl CudaKvCache {
    /// Device address of slot 0 of state layer `layer` (0 without recurrent state).
    pub(crate) fn state_layer(&self, layer: usize) -> u64 {
        let l = &self.layout;
        self.state.as_ref().map_or(0, |t| t.ptr() + (layer * l.state_slots * l.state_len * 4) as u64)
    }

    /// Overwrites the recurrent state of slot `slot` in state layer `layer` (`state_len` f32;
    /// tests).
    pub fn write_state(&mut self, layer: usize, slot: usize, data: &[f32]) -> Result<()> {
        let l = &self.layout;
        let t = self.state.as_ref().filter(|_| layer < l.state_layers && slot < l.state_slots && data.len() == l.state_len).ok_or_else(|| FakError::invalid("state", format!("no state slot {slot} of layer {layer} of {} values", data.len())))?;
        t.mem.write((layer * l.state_slots + slot) * l.state_len * 4, data)
    }

    /// The recurrent state of slot `slot` in state layer `layer` (`state_len` f32; tests).
    pub fn read_state(&self, layer: usize, slot: usize) -> Result<Vec<f32>> {
        let l = &self.layout;
        let t = self.state.as_ref().filter(|_| layer < l.state_layers && slot < l.state_slots).ok_or_else(|| FakError::invalid("state", format!("no state slot {slot} of layer {layer}")))?;
        let mut out = vec![0f32; l.state_len];
        t.mem.read((layer * l.state_slots + slot) * l.state_len * 4, &mut out)?;
        Ok(out)
    }

    pub(crate) fn k_layer(&self, layer: usize) -> u64 {
        self.k.ptr() + (layer * self.layer_elems * 2) as u64
    }
    pub(crate) fn v_layer(&self, layer: usize) -> u64 {
        self.v.ptr() + (layer * self.layer_elems * 2) as u64
    }
}

/// Offsets (in u32 elements) of the batch arrays inside one device allocation.
#[derive(Debug, Clone, Copy)]
struct BatchLayout {
    tokens: usize,
    positions: usize,
    slots: usize,
    seqs: usize,
    /// The recurrent-state slot of each sequence ([`crate::backend::SeqRows::state_slot`]).
    states: usize,
    logit_rows: usize,
    tables: usize,
    total: usize,
}

impl BatchLayout {
    fn new(l: &BatchLimits) -> BatchLayout {
        let t = l.max_tokens;
        let tokens = 0;
        let positions = tokens + t;
        let slots = positions + t;
        let logit_rows = slots + t;
        let seqs = logit_rows + t;
        let states = seqs + 5 * l.max_seqs;
        let tables = states + l.max_seqs;
        let total = tables + l.max_seqs.max(1) * l.max_blocks_per_seq.max(1);
        BatchLayout { tokens, positions, slots, seqs, states, logit_rows, tables, total }
    }
}

/// The batch: the host plan plus its device copy.
pub struct CudaBatch {
    pub plan: BatchPlan,
    pub limits: BatchLimits,
    layout: BatchLayout,
    dev: Tracked,
    staging: PinnedMem,
    /// Arrival counters of the split-KV attention, `counters_len` u32, zero between launches.
    pub(crate) counters: Tracked,
    pub(crate) counters_len: usize,
}

impl CudaBatch {
    fn at(&self, off: usize) -> u64 {
        self.dev.ptr() + (off * 4) as u64
    }
    pub(crate) fn tokens(&self) -> u64 {
        self.at(self.layout.tokens)
    }
    pub(crate) fn positions(&self) -> u64 {
        self.at(self.layout.positions)
    }
    pub(crate) fn slots(&self) -> u64 {
        self.at(self.layout.slots)
    }
    pub(crate) fn seqs(&self) -> u64 {
        self.at(self.layout.seqs)
    }
    pub(crate) fn logit_rows(&self) -> u64 {
        self.at(self.layout.logit_rows)
    }
    pub(crate) fn tables(&self) -> u64 {
        self.at(self.layout.tables)
    }
    pub(crate) fn states(&self) -> u64 {
        self.at(self.layout.states)
    }
}

/// Scratch of the split-KV attention and of the split-K GEMM (partial results), sized on first
/// use and never shrunk (captured graphs hold its addresses).
#[derive(Default)]
pub(crate) struct AttnScratch {
    pub(crate) ws: Option<Tracked>,
    pub(crate) ws_bytes: usize,
    /// Superseded allocations kept alive for graphs captured with them.
    pub(crate) old: Vec<Tracked>,
}

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    pub dev: Arc<Device>,
    pub kernels: Kernels,
    pub graphs: graph::Graphs,
    pub(crate) attn: Mutex<AttnScratch>,
    pub(crate) small: Mutex<Option<Tracked>>,
    /// Partial sums of the split-K GEMM (the same growth rule as the attention's).
    pub(crate) mm: Mutex<AttnScratch>,
    /// The MoE grouped GEMM's expert index and gathered activations (`ops::moe`).
    pub(crate) moe: Mutex<ops::MoeScratch>,
    /// The copy stream and staging slots of host experts run on the GPU (`ops::moe_host`).
    pub(crate) moe_staging: Mutex<ops::ExpertStaging>,
    /// Rows from which host experts run on the GPU (`ops::moe_host`; `usize::MAX`: never).
    pub(crate) moe_upload_min_rows: usize,
    /// The Gated DeltaNet layers' intermediate rows (`ops::deltanet`).
    pub(crate) gdn: Mutex<ops::GdnScratch>,
    /// Arrival counters of the split-K GEMM, one per output tile, zero between launches.
    pub(crate) mm_counters: Tracked,
    /// Whether the current forward is a decode step (every sequence one row: the forward has a
    /// graph key; set by `run_forward` while it runs), which selects the matmul table's decode
    /// choices.
    pub(crate) decode_step: std::sync::atomic::AtomicBool,
    /// When launches use programmatic dependent launch (sm_90+, `FAK_CUDA_PDL`; see `launch.rs`).
    pub pdl: launch::Pdl,
    /// Whether they do now: in the forward that `run_forward` runs, or always under `Pdl::All`.
    pub(crate) pdl_now: std::sync::atomic::AtomicBool,
    /// A Gated DeltaNet layer runs chunked when a sequence of the batch has at least this many
    /// rows (`ops::deltanet`; `FAK_GDN_CHUNK_MIN_ROWS` when the backend is created).
    pub(crate) gdn_chunk_min_rows: usize,
}

impl CudaBackend {
    /// Opens GPU `ordinal` and loads the kernels.
    ///
    /// Errors: [`FakError::Backend`] when no GPU is usable, naming why (no driver, no device,
    /// compute capability below 8.0, no kernel image and no NVRTC).
    pub fn new(ordinal: i32) -> Result<CudaBackend> {
        let dev = Device::open(ordinal)?;
        let kernels = Kernels::load(&dev)?;
        let pdl = launch::pdl_mode(dev.info.sm(), dev.info.driver_version);
        let mm_counters = Tracked::new(dev.alloc(4 * ops::MM_COUNTERS)?, &MEMORY.activations);
        mm_counters.mem.memset(0)?;
        Ok(CudaBackend {
            dev,
            kernels,
            graphs: graph::Graphs::from_env(),
            attn: Mutex::new(AttnScratch::default()),
            small: Mutex::new(None),
            mm: Mutex::new(AttnScratch::default()),
            moe: Mutex::new(ops::MoeScratch::default()),
            moe_staging: Mutex::new(ops::ExpertStaging::default()),
            moe_upload_min_rows: ops::upload_min_rows_from_env(),
            gdn: Mutex::new(ops::GdnScratch::default()),
            mm_counters,
            decode_step: std::sync::atomic::AtomicBool::new(false),
            pdl,
            pdl_now: std::sync::atomic::AtomicBool::new(pdl == launch::Pdl::All),
            gdn_chunk_min_rows: ops::gdn_chunk_min_rows(),
        })
    }

    pub(crate) fn alloc_tracked(&self, bytes: usize, counter: &'static AtomicUsize) -> Result<Tracked> {
        Ok(Tracked::new(self.dev.alloc(bytes)?, counter))
    }

    /// A batch buffer (for tests): `data` uploaded.
    pub fn upload_buffer(&self, data: &[f32]) -> Result<CudaBuffer> {
        let b = self.alloc_buffer(data.len())?;
        b.mem.mem.write(0, data)?;
        Ok(b)
    }

    /// Fills the first `n` elements of `buf` with `v` (tests poison outputs with NaN).
    pub fn fill(&self, buf: &mut CudaBuffer, v: f32, n: usize) -> Result<()> {
        buf.written();
        let n = n.min(buf.len);
        let blocks = n.div_ceil(256).clamp(1, 4096) as u32;
        self.launch("elementwise", "fill_f32", (blocks, 1, 1), 256, 0, launch::Args::new().ptr(buf.ptr()).f32(v).u64(n as u64))
    }

    /// Reads `layer`'s K or V of `positions` of a sequence with `block_table` as f32
    /// `[n, n_head_kv, head_dim]` (tests).
    pub fn read_kv(&self, cache: &CudaKvCache, layer: usize, values: bool, block_table: &[u32], positions: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let KvLayout { block_size, n_head_kv, head_dim, .. } = cache.layout;
        let mut all = vec![0u16; cache.layer_elems];
        let src = if values { &cache.v } else { &cache.k };
        src.mem.read(layer * cache.layer_elems * 2, &mut all)?;
        let mut out = vec![0f32; positions.len() * n_head_kv * head_dim];
        for (i, p) in positions.enumerate() {
            let blk = block_table[p / block_size] as usize;
            for h in 0..n_head_kv {
                let base = ((blk * n_head_kv + h) * block_size + p % block_size) * head_dim;
                for d in 0..head_dim {
                    out[(i * n_head_kv + h) * head_dim + d] = half::f16::from_bits(all[base + d]).to_f32();
                }
            }
        }
        Ok(out)
    }

    /// A small device scratch of at least `bytes` (argmax results).
    pub(crate) fn small_scratch(&self, bytes: usize) -> Result<u64> {
        let mut g = self.small.lock().unwrap_or_else(|e| e.into_inner());
        if g.as_ref().map_or(true, |t| t.mem.len() < bytes) {
            *g = Some(self.alloc_tracked(bytes.max(4096), &MEMORY.activations)?);
        }
        Ok(g.as_ref().unwrap().ptr())
    }
}

/// Whether a CUDA GPU is usable here: the driver loads, a device exists, its compute capability
/// is ≥ 8.0 (no kernel is loaded; cheap enough for `backend="auto"`).
pub fn available() -> bool {
    probe().is_ok()
}

/// [`available`] with the reason when not.
pub fn probe() -> Result<DeviceInfo> {
    Device::open(0).map(|d| d.info.clone())
}

/// How each op runs on the GPU (kernel and method), for `fak doctor`.
pub fn op_paths() -> Vec<(&'static str, &'static str)> {
    vec![
        ("embed", "embed_<fmt>_f32: gather + dequantize rows straight from the GGUF blocks"),
        ("rmsnorm", "rmsnorm_f32_q8_c<n>: RMSNorm (f64 sum of squares, as the CPU) fused with the 8-bit quantization of its output (q8_0 and q8_K forms, bit-exact with the CPU's quantizers)"),
        ("matmul decode (≤ 8 rows)", "mmvq_<kquant_q8_K|legacy_q8_0>_c<rows>: int8 dp4a GEMV on the activations quantized as the CPU does (Q8_K for k-quants, Q8_0/Q8_1 for legacy formats), integer sub-block sums scaled as the CPU; Q/K/V and gate/up in one launch; bias and residual add fused"),
        ("matmul dense weights (≤ 8 rows)", "mmv_<f32|f16|bf16>_f32_c<rows>: f32 GEMV"),
        ("matmul F32 weights (> 8 rows: MoE routers)", "mmv_f32_f32_c8 over chunks of 8 rows in one launch up to 2048 rows; above, sgemm_f32: tiled f32 SIMT GEMM (FMA, no f16/tf32 rounding)"),
        ("matmul prefill (> 8 rows)", "mmq_<fmt>_q8_n64: int8 tensor-core GEMM (mma.sync m16n8k32/k16 s8) on the CPU-faithful 8-bit activations, integer sub-block sums scaled as the CPU; bias and residual add fused (FAK_CUDA_MMQ=f16, and dense weights: mmq_<fmt>_f16_n<64|128>, f16 tiles)"),
        ("rope", "rope_f32: NORM/NEOX, ggml angle rounding, freq factors"),
        ("rope + kv_write (forward)", "rope_qk_kv_write_f32: q and k RoPE and the f16 KV write in one launch"),
        ("kv_write", "kv_write_f16: paged f16 KV cache"),
        ("attention", "fattn_f16_d<D>_w<warps>: flash attention (mma.sync), GQA, paged KV, D 16 … 128 and 256 (Q fragments from shared memory); decode splits long KV (flash-decoding) with an in-kernel combine"),
        ("swiglu", "swiglu_f32_q8: SwiGLU fused with the 8-bit quantization for the down projection"),
        ("add", "add_f32: residual add (the forward's adds are fused into the o/down projections)"),
        ("gather_logit_rows", "gather_rows_f32"),
        ("delta_net (hybrids)", "the projections on the matmul kernels; gdn_conv_silu_f32: causal conv + SiLU per channel and the conv state; gdn_recurrence_d<D>: per (sequence, value head) the L2 norms, gates, delta rule on the f32 state in registers, token by token, and the gated RMSNorm; with FAK_GDN_CHUNK_MIN_ROWS=64 (opt-in) and a sequence of the batch of ≥ 64 rows, gdn_chunk_d<D>: chunks of 64 rows in the WY form (forward substitution of (I + A)·Δ = R), one block per (sequence, value head, 32 value columns), then gdn_gated_norm_f32"),
        ("split_q_gate / mul_sigmoid / mul_rows_sigmoid (hybrids)", "split_q_gate_f32, mul_sigmoid_f32, mul_rows_sigmoid_f32: gated attention and the shared expert's gate"),
        ("copy_state (hybrids)", "gdn_copy_state_f32: a recurrent-state slot of every state layer"),
        ("argmax", "argmax_f32: on-device argmax (+ log-sum-exp)"),
        ("greedy step", "greedy_partial_f32 + greedy_final_f32: argmax and its log-softmax on the device, the row split over up to 128 blocks; 2 numbers per row come back"),
        ("decode step", "CUDA graph per (batch size, logit rows), replayed (FAK_CUDA_GRAPHS=0: off)"),
    ]
}

/// `FAK_CUDA_SAFE=1` selects the first, simpler kernel variants where a faster one exists
/// (RMSNorm in two passes; the split attention combined by its last block) — a fallback for
/// bisecting a numerical problem.
pub(crate) fn safe_kernels() -> bool {
    static SAFE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAFE.get_or_init(|| matches!(std::env::var("FAK_CUDA_SAFE").as_deref(), Ok("1" | "on" | "true" | "yes")))
}

fn kernel_fmt(t: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match t {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q4_K => "q4_K",
        Q5_K => "q5_K",
        Q6_K => "q6_K",
        _ => return None,
    })
}

fn is_dense(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// A kernel name built at run time, kept for the life of the process (names are few).
pub(crate) fn intern(s: String) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut v = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&n) = v.iter().find(|&&n| n == s) {
        return n;
    }
    let n: &'static str = Box::leak(s.into_boxed_str());
    v.push(n);
    n
}

impl Backend for CudaBackend {
    type Weight = CudaWeight;
    type Buffer = CudaBuffer;
    type KvCache = CudaKvCache;
    type Batch = CudaBatch;
    type HostBuf = device::HostF32;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn load_weight(&self, t: &HostTensor<'_>) -> Result<CudaWeight> {
        let n_elements: usize = t.dims.iter().product();
        let k = t.dims.first().copied().unwrap_or(1);
        let row_bytes = t
            .wtype
            .row_bytes(k as u64)
            .map(|r| r as usize)
            .ok_or_else(|| FakError::model(format!("tensor {}: {k} elements per row is not a whole number of {} blocks", t.name, t.wtype.name())))?;
        if t.data.len() != row_bytes * (n_elements / k.max(1)) {
            return Err(FakError::model(format!("tensor {}: {} bytes of data, shape {:?} of {} needs {}", t.name, t.data.len(), t.dims, t.wtype.name(), row_bytes * (n_elements / k.max(1)))));
        }
        if t.dims.len() <= 1 {
            let mut v = vec![0f32; n_elements];
            crate::quant::dequantize_row(t.wtype, t.data, &mut v).map_err(|e| FakError::model(format!("tensor {}: {e}", t.name)))?;
            let mem = Tracked::new(self.dev.upload(&v)?, &MEMORY.weights);
            return Ok(CudaWeight { name: t.name.to_string(), wtype: GgmlType::F32, dims: t.dims.to_vec(), row_bytes: 4 * k, mem, host: None });
        }
        if t.wtype == GgmlType::F32 && k % 32 != 0 {
            // f32 rows of any length (a Gated DeltaNet's conv taps `[d_conv, conv_dim]`): read by
            // their own kernels, never by a matmul (`op_matmul` refuses rows that are not whole
            // multiples of 32)
            let mem = Tracked::new(self.dev.upload(t.data)?, &MEMORY.weights);
            return Ok(CudaWeight { name: t.name.to_string(), wtype: t.wtype, dims: t.dims.to_vec(), row_bytes, mem, host: None });
        }
        if kernel_fmt(t.wtype).is_none() {
            return Err(FakError::Unsupported(format!(
                "the CUDA backend has no kernel for tensor {} of type {} (supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32)",
                t.name,
                t.wtype.name()
            )));
        }
        if k % 32 != 0 {
            return Err(FakError::Unsupported(format!("the CUDA backend needs rows of a multiple of 32 elements; tensor {} has {k}", t.name)));
        }
        let mem = Tracked::new(self.dev.upload(t.data)?, &MEMORY.weights);
        Ok(CudaWeight { name: t.name.to_string(), wtype: t.wtype, dims: t.dims.to_vec(), row_bytes, mem, host: None })
    }

    fn load_weight_host(&self, t: &HostTensor<'_>) -> Result<CudaWeight> {
        let k = t.dims.first().copied().unwrap_or(1);
        let row_bytes = t
            .wtype
            .row_bytes(k as u64)
            .map(|r| r as usize)
            .ok_or_else(|| FakError::model(format!("tensor {}: {k} elements per row is not a whole number of {} blocks", t.name, t.wtype.name())))?;
        let n_rows: usize = t.dims.iter().skip(1).product();
        if t.data.len() != row_bytes * n_rows || t.dims.len() < 2 {
            return Err(FakError::model(format!("tensor {}: {} bytes of data do not hold shape {:?} of {}", t.name, t.data.len(), t.dims, t.wtype.name())));
        }
        HOST_EXPERT_BYTES.fetch_add(t.data.len(), Ordering::Relaxed);
        let mem = Tracked::new(self.dev.alloc(256)?, &MEMORY.weights);
        // Page-locking serves the uploads (none while they are off); a refusal leaves the bytes
        // pageable.
        let pinned = if self.moe_upload_min_rows != usize::MAX && may_pin(t.data.len()) { copy::HostRegistration::new(&self.dev, t.data.as_ptr(), t.data.len()).ok().flatten() } else { None };
        if let Some(r) = &pinned {
            HOST_EXPERT_PINNED.fetch_add(r.len(), Ordering::Relaxed);
        }
        let host = HostBlocks { ptr: t.data.as_ptr(), len: t.data.len(), pinned, _owner: t.owner.clone() };
        Ok(CudaWeight { name: t.name.to_string(), wtype: t.wtype, dims: t.dims.to_vec(), row_bytes, mem, host: Some(host) })
    }

    fn alloc_buffer(&self, n: usize) -> Result<CudaBuffer> {
        let mem = self.alloc_tracked(4 * n.max(1), &MEMORY.activations)?;
        mem.mem.memset(0)?;
        let (q8_off, q8_bytes) = CudaBuffer::q8_layout(n);
        let q8 = self.alloc_tracked(q8_bytes, &MEMORY.activations)?;
        Ok(CudaBuffer { mem, len: n, q8, q8_off, q8_len: Cell::new(0), q8k_len: Cell::new(0) })
    }

    fn alloc_kv_cache(&self, layout: KvLayout) -> Result<CudaKvCache> {
        if layout.block_size != 32 {
            return Err(FakError::Unsupported(format!("the CUDA attention kernels need a KV block size of 32 tokens, not {}", layout.block_size)));
        }
        let layer_elems = layout
            .n_blocks
            .checked_mul(layout.n_head_kv * layout.block_size * layout.head_dim)
            .ok_or_else(|| FakError::invalid("kv_cache_tokens", "KV cache size overflows"))?;
        let bytes = layer_elems * 2 * layout.n_layer;
        let k = self.alloc_tracked(bytes, &MEMORY.kv_cache)?;
        let v = self.alloc_tracked(bytes, &MEMORY.kv_cache)?;
        k.mem.memset(0)?;
        v.mem.memset(0)?;
        let state_elems = layout
            .state_layers
            .checked_mul(layout.state_slots)
            .and_then(|x| x.checked_mul(layout.state_len))
            .ok_or_else(|| FakError::invalid("max_batch", "recurrent state size overflows"))?;
        let state = if state_elems > 0 {
            let t = self.alloc_tracked(state_elems * 4, &MEMORY.kv_cache)?;
            t.mem.memset(0)?;
            Some(t)
        } else {
            None
        };
        Ok(CudaKvCache { layout, k, v, layer_elems, state })
    }

    fn alloc_batch(&self, limits: BatchLimits) -> Result<CudaBatch> {
        let layout = BatchLayout::new(&limits);
        let dev = self.alloc_tracked(layout.total * 4, &MEMORY.activations)?;
        dev.mem.memset(0)?;
        let staging = PinnedMem::new(&self.dev, layout.total * 4)?;
        let counters_len = limits.max_seqs.max(1) * 64;
        let counters = self.alloc_tracked(counters_len * 4, &MEMORY.activations)?;
        counters.mem.memset(0)?;
        Ok(CudaBatch { plan: BatchPlan::default(), limits, layout, dev, staging, counters, counters_len })
    }

    fn set_batch(&self, batch: &mut CudaBatch, plan: &BatchPlan) -> Result<()> {
        let l = batch.layout;
        let lim = batch.limits;
        if plan.n_tokens() > lim.max_tokens || plan.seqs.len() > lim.max_seqs || plan.block_tables.len() > l.total - l.tables || plan.logit_rows.len() > lim.max_tokens {
            return Err(FakError::invalid("batch", format!("{} tokens / {} sequences exceed the batch limits {} / {}", plan.n_tokens(), plan.seqs.len(), lim.max_tokens, lim.max_seqs)));
        }
        // The previous forward's copy out of the staging memory must be complete.
        self.dev.synchronize()?;
        batch.plan.clone_from(plan);
        let st = batch.staging.as_mut_slice();
        let put = |st: &mut [u8], off: usize, v: &[u32]| {
            for (i, x) in v.iter().enumerate() {
                st[(off + i) * 4..(off + i) * 4 + 4].copy_from_slice(&x.to_le_bytes());
            }
        };
        put(st, l.tokens, &plan.tokens);
        put(st, l.positions, &plan.positions);
        put(st, l.slots, &plan.slots);
        put(st, l.logit_rows, &plan.logit_rows);
        let seqs: Vec<u32> = plan.seqs.iter().flat_map(|s| [s.row0, s.n_rows, s.n_past, s.table0, s.n_blocks]).collect();
        put(st, l.seqs, &seqs);
        let states: Vec<u32> = plan.seqs.iter().map(|s| s.state_slot).collect();
        put(st, l.states, &states);
        put(st, l.tables, &plan.block_tables);
        let bytes = (l.tables + plan.block_tables.len()) * 4;
        self.dev.bind()?;
        // SAFETY: pinned source of `bytes` ≤ its size; destination allocation of the same layout.
        device::drv("cuMemcpyHtoDAsync", unsafe {
            cudarc::driver::sys::cuMemcpyHtoDAsync_v2(batch.dev.ptr(), batch.staging.as_ptr() as *const std::ffi::c_void, bytes, self.dev.stream)
        })
    }

    fn run_forward(&self, key: Option<GraphKey>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.decode_step.store(key.is_some(), Ordering::Relaxed);
        let pdl = match self.pdl {
            launch::Pdl::Off => false,
            launch::Pdl::All => true,
            launch::Pdl::SmallDecode => key.is_some_and(|k| k.n_tokens <= launch::PDL_MAX_ROWS),
        };
        self.pdl_now.store(pdl, Ordering::Relaxed);
        // restores both flags when the forward returns, with an error or by a panic
        struct Restore<'a>(&'a CudaBackend);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.decode_step.store(false, Ordering::Relaxed);
                self.0.pdl_now.store(self.0.pdl == launch::Pdl::All, Ordering::Relaxed);
            }
        }
        let _restore = Restore(self);
        self.graphs.run(&self.dev, key, f)
    }

    fn synchronize(&self) -> Result<()> {
        self.dev.synchronize()
    }

    fn embed(&self, table: &CudaWeight, batch: &CudaBatch, n_tokens: usize, out: &mut CudaBuffer) -> Result<()> {
        self.op_embed(table, batch, n_tokens, out)
    }

    fn rmsnorm(&self, x: &CudaBuffer, w: &CudaWeight, eps: f32, n_rows: usize, dim: usize, out: &mut CudaBuffer) -> Result<()> {
        self.op_rmsnorm(x, w, eps, n_rows, dim, out)
    }

    fn matmul(&self, w: &CudaWeight, bias: Option<&CudaWeight>, x: &CudaBuffer, n_rows: usize, out: &mut CudaBuffer) -> Result<()> {
        self.op_matmul(w, bias, x, n_rows, out, false)
    }

    fn matmul_multi(&self, ws: &[(&CudaWeight, Option<&CudaWeight>)], x: &CudaBuffer, n_rows: usize, outs: &mut [&mut CudaBuffer]) -> Result<()> {
        self.op_matmul_multi(ws, x, n_rows, outs)
    }

    fn matmul_add(&self, w: &CudaWeight, bias: Option<&CudaWeight>, x: &CudaBuffer, n_rows: usize, n_out: usize, _tmp: &mut CudaBuffer, res: &mut CudaBuffer) -> Result<()> {
        if w.n_out() != n_out {
            return Err(FakError::invalid("matmul_add", format!("{} has {} outputs, not {n_out}", w.name, w.n_out())));
        }
        self.op_matmul(w, bias, x, n_rows, res, true)
    }

    fn rope_kv_write(
        &self,
        q: &mut CudaBuffer,
        k: &mut CudaBuffer,
        v: &CudaBuffer,
        cache: &mut CudaKvCache,
        layer: usize,
        batch: &CudaBatch,
        n_rows: usize,
        attn: &AttnParams,
        rope: &RopeParams,
        freq_factors: Option<&CudaWeight>,
        qk_norm: Option<(&CudaWeight, &CudaWeight, f32)>,
    ) -> Result<()> {
        self.op_rope_kv_write(q, k, v, cache, layer, batch, n_rows, attn, rope, freq_factors, qk_norm)
    }

    fn rope(&self, x: &mut CudaBuffer, batch: &CudaBatch, n_rows: usize, n_heads: usize, head_dim: usize, rope: &RopeParams, freq_factors: Option<&CudaWeight>) -> Result<()> {
        self.op_rope(x, batch, n_rows, n_heads, head_dim, rope, freq_factors)
    }

    fn kv_write(&self, cache: &mut CudaKvCache, layer: usize, k: &CudaBuffer, v: &CudaBuffer, batch: &CudaBatch, n_rows: usize) -> Result<()> {
        self.op_kv_write(cache, layer, k, v, batch, n_rows)
    }

    fn attention(&self, q: &CudaBuffer, cache: &CudaKvCache, layer: usize, batch: &CudaBatch, n_rows: usize, params: &AttnParams, out: &mut CudaBuffer) -> Result<()> {
        self.op_attention(q, cache, layer, batch, n_rows, params, out)
    }

    fn swiglu(&self, gate: &mut CudaBuffer, up: &CudaBuffer, n: usize) -> Result<()> {
        self.op_swiglu(gate, up, n)
    }

    fn add(&self, x: &mut CudaBuffer, y: &CudaBuffer, n: usize) -> Result<()> {
        self.op_add(x, y, n)
    }

    fn zero(&self, x: &mut CudaBuffer, n: usize) -> Result<()> {
        self.fill(x, 0.0, n)
    }

    fn moe_localize(&self, _ids: &mut CudaBuffer, _weights: &mut CudaBuffer, _n_pairs: usize, _e0: usize, _e1: usize) -> Result<()> {
        // The expert GEMV/GEMM kernels take ids in 0..n_expert only; tensor parallelism on CUDA is
        // not built (docs/tensor-parallel.md).
        Err(FakError::Unsupported("MoE experts divided among tensor-parallel shards on CUDA".into()))
    }

    fn rmsnorm_inplace(&self, x: &mut CudaBuffer, w: &CudaWeight, eps: f32, n_rows: usize, dim: usize) -> Result<()> {
        self.op_rmsnorm_inplace(x, w, eps, n_rows, dim)
    }

    fn moe_route(&self, logits: &CudaBuffer, n_rows: usize, n_expert: usize, k: usize, norm_w: bool, w_scale: f32, ids: &mut CudaBuffer, weights: &mut CudaBuffer) -> Result<()> {
        self.op_moe_route(logits, n_rows, n_expert, k, norm_w, w_scale, ids, weights)
    }

    fn matmul_id(&self, w: &CudaWeight, x: &CudaBuffer, ids: &CudaBuffer, n_rows: usize, k: usize, x_per_pair: bool, out: &mut CudaBuffer) -> Result<()> {
        self.op_matmul_id(&[w], x, ids, n_rows, k, x_per_pair, &mut [out])
    }

    fn moe_combine(&self, experts: &CudaBuffer, weights: &CudaBuffer, n_rows: usize, k: usize, dim: usize, res: &mut CudaBuffer) -> Result<()> {
        self.op_moe_combine(experts, weights, 0, n_rows, k, dim, res)
    }

    fn delta_net(
        &self,
        w: &crate::backend::DeltaNetWeights<'_, CudaWeight>,
        p: &crate::backend::DeltaNetParams,
        h: &CudaBuffer,
        cache: &mut CudaKvCache,
        batch: &CudaBatch,
        n_rows: usize,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.op_delta_net(w, p, h, cache, batch, n_rows, out)
    }

    fn copy_state(&self, cache: &mut CudaKvCache, from: usize, to: usize) -> Result<()> {
        self.op_copy_state(cache, from, to)
    }

    fn split_q_gate(&self, qg: &CudaBuffer, n_rows: usize, n_head: usize, head_dim: usize, q: &mut CudaBuffer, gate: &mut CudaBuffer) -> Result<()> {
        self.op_split_q_gate(qg, n_rows, n_head, head_dim, q, gate)
    }

    fn mul_rows_sigmoid(&self, x: &mut CudaBuffer, g: &CudaBuffer, n_rows: usize, dim: usize) -> Result<()> {
        self.op_mul_rows_sigmoid(x, g, n_rows, dim)
    }

    fn mul_sigmoid(&self, x: &mut CudaBuffer, gate: &CudaBuffer, n: usize) -> Result<()> {
        self.op_mul_sigmoid(x, gate, n)
    }

    fn moe_ffn(&self, h: &CudaBuffer, w: &crate::backend::MoeWeights<'_, CudaWeight>, p: &crate::backend::MoeParams, n_rows: usize, s: crate::backend::MoeBuffers<'_, CudaBuffer>, res: &mut CudaBuffer) -> Result<()> {
        self.op_moe_ffn(h, w, p, n_rows, s, res)
    }

    fn gather_logit_rows(&self, x: &CudaBuffer, batch: &CudaBatch, dim: usize, out: &mut CudaBuffer) -> Result<()> {
        self.op_gather_rows(x, batch, dim, out)
    }

    fn read_f32(&self, buf: &CudaBuffer, out: &mut [f32]) -> Result<()> {
        if out.len() > buf.len {
            return Err(backend_err(format!("read of {} elements from a buffer of {}", out.len(), buf.len)));
        }
        buf.mem.mem.read(0, out)
    }

    fn host_buffer(&self, n: usize) -> Result<device::HostF32> {
        device::HostF32::new(&self.dev, n)
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn top_rows(&self, x: &CudaBuffer, n_cols: usize, rows: &[u32], m: usize, out: &mut crate::backend::TopRows) -> Result<()> {
        self.op_top_rows(x, n_cols, rows, m, out)
    }

    fn penalize_rows(&self, x: &mut CudaBuffer, n_cols: usize, pens: &[crate::backend::LogitPenalty], raw: &mut [f32]) -> Result<()> {
        self.op_penalize(x, n_cols, pens, raw)
    }

    fn draw_rows(&self, x: &CudaBuffer, n_cols: usize, draws: &[crate::backend::DrawRequest], out: &mut crate::backend::DrawnRows) -> Result<()> {
        self.op_draw(x, n_cols, draws, out)
    }

    fn read_row_f32(&self, x: &CudaBuffer, row: usize, n_cols: usize, out: &mut [f32]) -> Result<()> {
        if (row + 1) * n_cols > x.len || out.len() != n_cols {
            return Err(backend_err(format!("read of row {row} of {n_cols} from a buffer of {}", x.len)));
        }
        x.mem.mem.read(row * n_cols * 4, out)
    }

    fn argmax_rows(&self, x: &CudaBuffer, n_rows: usize, n_cols: usize, out: &mut [u32]) -> Result<()> {
        self.op_argmax(x, n_rows, n_cols, out)
    }

    fn greedy_rows(&self, x: &CudaBuffer, n_rows: usize, n_cols: usize, tokens: &mut [u32], logprobs: &mut [f32]) -> Result<()> {
        self.op_greedy(x, n_rows, n_cols, tokens, logprobs)
    }
}
