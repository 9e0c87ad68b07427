//! Bindings of the CUDA backend for `fak doctor` and the op-by-op tests: `cuda_available`,
//! `cuda_info`, `cuda_memory`, `cuda_kernel_families`, `cuda_nvrtc_compile`, and `OpRunner`
//! (single ops of the cpu or cuda backend on NumPy arrays). Conversions only; compute releases
//! the GIL.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::{detach, to_py};
use crate::backend::cpu::CpuBackend;
use crate::backend::optest::{self, AttnCase};
use crate::backend::{AttnParams, DrawRequest, LogitPenalty, RopeParams, RopeStyle};
use crate::quant::GgmlType;
use crate::FakError;

/// cuda_available() -> bool: whether `backend="cuda"` can run here (driver, a device of compute
/// capability ≥ 8.0). Never raises.
#[pyfunction]
fn cuda_available(py: Python<'_>) -> bool {
    #[cfg(feature = "cuda")]
    {
        py.detach(crate::backend::cuda::available)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = py;
        false
    }
}

/// cuda_info(load_kernels=True) -> dict: `available`, `reason` (when not), `built_with_cuda`,
/// `build_archs` (nvcc cubins embedded), `kernel_families`; with a GPU also `device`,
/// `compute_capability`, `sm_count`, `total_memory_bytes`, `driver_version`, `graphs`, `ops`
/// (op → kernel path) and, with `load_kernels`, `kernel_images` (family → where its image came
/// from), `pdl` (the mode of programmatic dependent launch: `off`, `small-decode` (decode steps of
/// ≤ 16 rows) or `all`), `pdl_families` (the families it applies to: images compiled for sm_90+,
/// not skipped) and `nvrtc_version`.
#[pyfunction]
#[pyo3(signature = (load_kernels=true))]
fn cuda_info<'py>(py: Python<'py>, load_kernels: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("built_with_cuda", cfg!(feature = "cuda"))?;
    #[cfg(not(feature = "cuda"))]
    {
        let _ = load_kernels;
        d.set_item("available", false)?;
        d.set_item("reason", "this fak build has no CUDA backend (cargo feature `cuda` off)")?;
        Ok(d)
    }
    #[cfg(feature = "cuda")]
    {
        use crate::backend::cuda::{self as cu, module};
        d.set_item("build_archs", module::BUILD_ARCHS.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>())?;
        d.set_item("kernel_families", module::SOURCES.iter().map(|s| s.0).collect::<Vec<_>>())?;
        d.set_item("kernel_cache", module::cache_dir().map(|p| p.display().to_string()))?;
        let ops = PyDict::new(py);
        for (k, v) in cu::op_paths() {
            ops.set_item(k, v)?;
        }
        d.set_item("ops", ops)?;
        match py.detach(cu::probe) {
            Err(e) => {
                d.set_item("available", false)?;
                d.set_item("reason", e.to_string())?;
            }
            Ok(info) => {
                d.set_item("available", true)?;
                d.set_item("device", &info.name)?;
                d.set_item("compute_capability", format!("{}.{}", info.cc.0, info.cc.1))?;
                d.set_item("sm_count", info.n_sm)?;
                d.set_item("l2_bytes", info.l2_bytes)?;
                d.set_item("total_memory_bytes", info.total_mem)?;
                d.set_item("driver_version", format!("{}.{}", info.driver_version / 1000, (info.driver_version % 1000) / 10))?;
                d.set_item("graphs", cu::graph::Graphs::from_env().enabled)?;
                if load_kernels {
                    match py.detach(|| cu::CudaBackend::new(0)) {
                        Ok(be) => {
                            let imgs = PyDict::new(py);
                            for (fam, origin) in be.kernels.origins() {
                                imgs.set_item(fam, origin.to_string())?;
                            }
                            d.set_item("kernel_images", imgs)?;
                            let pdl = match be.pdl {
                                cu::launch::Pdl::Off => "off",
                                cu::launch::Pdl::SmallDecode => "small-decode",
                                cu::launch::Pdl::All => "all",
                            };
                            d.set_item("pdl", pdl)?;
                            d.set_item("pdl_families", be.kernels.pdl_families())?;
                        }
                        Err(e) => d.set_item("kernel_error", e.to_string())?,
                    }
                    d.set_item("nvrtc_version", module::nvrtc_version().ok().map(|(a, b)| format!("{a}.{b}")))?;
                }
            }
        }
        Ok(d)
    }
}

/// cuda_devices() -> dict: every GPU the driver reports and how each pair is linked (for
/// `fak doctor`). Keys: `available` (bool), `reason` (when not), `devices` (list of dicts:
/// `ordinal`, `name`, `pci_bus_id`, `compute_capability`, `total_memory_bytes`), `peers` (one
/// dict per ordered pair: `a`, `b`, `access` (peer-to-peer possible), `perf_rank` (the driver's
/// relative link rank), `native_atomics`). Never raises for a missing GPU or driver.
#[pyfunction]
fn cuda_devices<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    #[cfg(not(feature = "cuda"))]
    {
        d.set_item("available", false)?;
        d.set_item("reason", "this fak build has no CUDA backend (cargo feature `cuda` off)")?;
        d.set_item("devices", PyList::empty(py))?;
        d.set_item("peers", PyList::empty(py))?;
    }
    #[cfg(feature = "cuda")]
    {
        match py.detach(crate::backend::cuda::device::list_gpus) {
            Err(e) => {
                d.set_item("available", false)?;
                d.set_item("reason", e.to_string())?;
                d.set_item("devices", PyList::empty(py))?;
                d.set_item("peers", PyList::empty(py))?;
            }
            Ok((gpus, links)) => {
                d.set_item("available", !gpus.is_empty())?;
                if gpus.is_empty() {
                    d.set_item("reason", "the CUDA driver reports no device")?;
                }
                let devs = PyList::empty(py);
                for g in gpus {
                    let x = PyDict::new(py);
                    x.set_item("ordinal", g.ordinal)?;
                    x.set_item("name", g.name)?;
                    x.set_item("pci_bus_id", g.pci_bus_id)?;
                    x.set_item("compute_capability", format!("{}.{}", g.cc.0, g.cc.1))?;
                    x.set_item("total_memory_bytes", g.total_mem)?;
                    devs.append(x)?;
                }
                d.set_item("devices", devs)?;
                let peers = PyList::empty(py);
                for l in links {
                    let x = PyDict::new(py);
                    x.set_item("a", l.a)?;
                    x.set_item("b", l.b)?;
                    x.set_item("access", l.access)?;
                    x.set_item("perf_rank", l.perf_rank)?;
                    x.set_item("native_atomics", l.native_atomics)?;
                    peers.append(x)?;
                }
                d.set_item("peers", peers)?;
            }
        }
    }
    Ok(d)
}

/// cuda_memory() -> dict: device bytes fak holds now, by kind (`weights`, `kv_cache`,
/// `activations`, `total`), and the host experts of `--cpu-moe` layers (`host_experts`, of them
/// `host_experts_pinned`; `expert_uploads`: bytes of them copied to the GPU so far).
#[pyfunction]
fn cuda_memory<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    #[cfg(feature = "cuda")]
    {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &crate::backend::cuda::MEMORY;
        let (w, k, a) = (m.weights.load(Relaxed), m.kv_cache.load(Relaxed), m.activations.load(Relaxed));
        d.set_item("weights", w)?;
        d.set_item("kv_cache", k)?;
        d.set_item("activations", a)?;
        d.set_item("total", w + k + a)?;
        // host memory: the experts of --cpu-moe layers, the part of them page-locked, and the
        // bytes of them copied to the GPU for large batches so far
        d.set_item("host_experts", crate::backend::cuda::HOST_EXPERT_BYTES.load(Relaxed))?;
        d.set_item("host_experts_pinned", crate::backend::cuda::HOST_EXPERT_PINNED.load(Relaxed))?;
        d.set_item("expert_uploads", crate::backend::cuda::EXPERT_UPLOAD_BYTES.load(Relaxed))?;
    }
    Ok(d)
}

/// cuda_kernel_families() -> list[str]: the kernel families embedded in this build.
#[pyfunction]
fn cuda_kernel_families() -> Vec<&'static str> {
    #[cfg(feature = "cuda")]
    {
        crate::backend::cuda::module::SOURCES.iter().map(|s| s.0).collect()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Vec::new()
    }
}

/// cuda_nvrtc_compile(family, sm) -> bytes: compiles the embedded source of `family` for
/// `sm_<sm>` with NVRTC (no GPU needed) and returns the cubin.
/// Raises fak.BackendError (no NVRTC library, compile error with NVRTC's log), ValueError
/// (unknown family).
#[pyfunction]
fn cuda_nvrtc_compile<'py>(py: Python<'py>, family: &str, sm: u32) -> PyResult<Bound<'py, PyBytes>> {
    #[cfg(feature = "cuda")]
    {
        use crate::backend::cuda::module;
        let src = module::SOURCES.iter().find(|s| s.0 == family).map(|s| s.1).ok_or_else(|| to_py(FakError::invalid("family", format!("unknown kernel family {family:?}"))))?;
        let cubin = detach(py, || module::nvrtc_compile(family, src, sm))?;
        Ok(PyBytes::new(py, &cubin))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (py, family, sm);
        Err(to_py(FakError::Backend { backend: "cuda".into(), msg: "this fak build has no CUDA backend".into() }))
    }
}

enum Runner {
    Cpu(CpuBackend),
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::backend::cuda::CudaBackend>),
}

/// Single ops of a backend on NumPy arrays, through the same trait calls as the forward pass
/// (tests compare `OpRunner("cuda")` with `OpRunner("cpu")`). Outputs are poisoned with NaN
/// before each op. Arrays are float32 (flat or any shape; row counts follow from the lengths).
#[pyclass(name = "OpRunner", module = "fak._native", frozen)]
pub struct PyOpRunner {
    runner: Runner,
}

fn slice<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, what: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|e| to_py(FakError::invalid(what, format!("must be contiguous: {e}"))))
}

fn gtype(name: &str) -> PyResult<GgmlType> {
    GgmlType::from_name(name).ok_or_else(|| to_py(FakError::invalid("wtype", format!("unknown ggml type {name:?}"))))
}

/// GGUF blocks (uint8, any shape) as bytes.
fn blocks<'a>(a: &'a PyReadonlyArrayDyn<'_, u8>, what: &str) -> PyResult<&'a [u8]> {
    a.as_slice().map_err(|e| to_py(FakError::invalid(what, format!("must be contiguous: {e}"))))
}

fn rope_style(style: &str) -> PyResult<RopeStyle> {
    match style {
        "neox" => Ok(RopeStyle::Neox),
        "norm" => Ok(RopeStyle::Norm),
        o => Err(to_py(FakError::invalid("style", format!("{o:?} (neox or norm)")))),
    }
}

/// `optest::op(backend, args…)` on the runner's backend, the GIL released: the one dispatch over
/// backends, so an op added to `optest` needs only its method below (and its `.pyi` stub).
macro_rules! run {
    ($runner:expr, $py:expr, $op:ident($($arg:expr),* $(,)?)) => {
        detach($py, || match &$runner.runner {
            Runner::Cpu(b) => optest::$op(b, $($arg),*),
            #[cfg(feature = "cuda")]
            Runner::Cuda(b) => optest::$op(b.as_ref(), $($arg),*),
        })
    };
}

type F32Out<'py> = Bound<'py, PyArray1<f32>>;

#[pymethods]
impl PyOpRunner {
    /// OpRunner(backend="cpu" | "cuda"). Raises fak.BackendError when the CUDA backend cannot start.
    #[new]
    #[pyo3(signature = (backend="cpu"))]
    fn new(py: Python<'_>, backend: &str) -> PyResult<PyOpRunner> {
        let runner = match backend {
            "cpu" => Runner::Cpu(CpuBackend::default()),
            #[cfg(feature = "cuda")]
            "cuda" => Runner::Cuda(Box::new(detach(py, || crate::backend::cuda::CudaBackend::new(0))?)),
            other => {
                let _ = py;
                return Err(to_py(FakError::invalid("backend", format!("{other:?} (this build runs \"cpu\"{})", if cfg!(feature = "cuda") { " or \"cuda\"" } else { "" }))));
            }
        };
        Ok(PyOpRunner { runner })
    }

    /// matmul(wtype, w, n_out, k, x, bias=None) -> y [n_rows·n_out]: `w` uint8 GGUF blocks of
    /// `n_out` rows of `k`, `x` float32 `[n_rows·k]`.
    #[pyo3(signature = (wtype, w, n_out, k, x, bias=None))]
    #[allow(clippy::too_many_arguments)]
    fn matmul<'py>(&self, py: Python<'py>, wtype: &str, w: PyReadonlyArrayDyn<'py, u8>, n_out: usize, k: usize, x: PyReadonlyArray1<'py, f32>, bias: Option<PyReadonlyArray1<'py, f32>>) -> PyResult<F32Out<'py>> {
        let t = gtype(wtype)?;
        let w = blocks(&w, "w")?;
        let x = slice(&x, "x")?;
        let bias = bias.as_ref().map(|b| slice(b, "bias")).transpose()?;
        Ok(run!(self, py, matmul(t, w, n_out, k, x, bias))?.into_pyarray(py))
    }

    /// norm_matmul(x, w_norm, eps, wtype, w, n_out, bias=None) -> y: RMSNorm then matmul (the
    /// fused q8_1 path on CUDA).
    #[pyo3(signature = (x, w_norm, eps, wtype, w, n_out, bias=None))]
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f32>, w_norm: PyReadonlyArray1<'py, f32>, eps: f32, wtype: &str, w: PyReadonlyArrayDyn<'py, u8>, n_out: usize, bias: Option<PyReadonlyArray1<'py, f32>>) -> PyResult<F32Out<'py>> {
        let t = gtype(wtype)?;
        let w = blocks(&w, "w")?;
        let (x, wn) = (slice(&x, "x")?, slice(&w_norm, "w_norm")?);
        let bias = bias.as_ref().map(|b| slice(b, "bias")).transpose()?;
        Ok(run!(self, py, norm_matmul(x, wn, eps, t, w, n_out, bias))?.into_pyarray(py))
    }

    /// swiglu_matmul(gate, up, k, wtype, w, n_out) -> y: SwiGLU then matmul (fused q8_1 on CUDA).
    #[allow(clippy::too_many_arguments)]
    fn swiglu_matmul<'py>(&self, py: Python<'py>, gate: PyReadonlyArray1<'py, f32>, up: PyReadonlyArray1<'py, f32>, k: usize, wtype: &str, w: PyReadonlyArrayDyn<'py, u8>, n_out: usize) -> PyResult<F32Out<'py>> {
        let t = gtype(wtype)?;
        let w = blocks(&w, "w")?;
        let (g, u) = (slice(&gate, "gate")?, slice(&up, "up")?);
        Ok(run!(self, py, swiglu_matmul(g, u, k, t, w, n_out))?.into_pyarray(py))
    }

    /// rmsnorm(x, w, eps) -> y (rows of len(w)).
    fn rmsnorm<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f32>, w: PyReadonlyArray1<'py, f32>, eps: f32) -> PyResult<F32Out<'py>> {
        let (x, w) = (slice(&x, "x")?, slice(&w, "w")?);
        Ok(run!(self, py, rmsnorm(x, w, eps))?.into_pyarray(py))
    }

    /// rope(x, positions, n_heads, head_dim, style, n_rot, freq_base, freq_scale, freq_factors=None,
    /// ext_factor=0.0, attn_factor=1.0, yarn_orig_ctx=0) -> y. With `ext_factor` ≠ 0 (YaRN) the
    /// correction dimensions come from `yarn_orig_ctx` and β_fast = 32, β_slow = 1.
    #[pyo3(signature = (x, positions, n_heads, head_dim, style, n_rot, freq_base, freq_scale, freq_factors=None, ext_factor=0.0, attn_factor=1.0, yarn_orig_ctx=0))]
    #[allow(clippy::too_many_arguments)]
    fn rope<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f32>, positions: PyReadonlyArray1<'py, u32>, n_heads: usize, head_dim: usize, style: &str, n_rot: usize, freq_base: f32, freq_scale: f32, freq_factors: Option<PyReadonlyArray1<'py, f32>>, ext_factor: f32, attn_factor: f32, yarn_orig_ctx: usize) -> PyResult<F32Out<'py>> {
        let p = rope_params(rope_style(style)?, n_rot, freq_base, freq_scale, ext_factor, attn_factor, yarn_orig_ctx);
        let (x, pos) = (slice(&x, "x")?, slice(&positions, "positions")?);
        let ff = freq_factors.as_ref().map(|f| slice(f, "freq_factors")).transpose()?;
        Ok(run!(self, py, rope(x, pos, n_heads, head_dim, &p, ff))?.into_pyarray(py))
    }

    /// swiglu(gate, up) -> silu(gate)·up.
    fn swiglu<'py>(&self, py: Python<'py>, gate: PyReadonlyArray1<'py, f32>, up: PyReadonlyArray1<'py, f32>) -> PyResult<F32Out<'py>> {
        let (g, u) = (slice(&gate, "gate")?, slice(&up, "up")?);
        Ok(run!(self, py, swiglu(g, u))?.into_pyarray(py))
    }

    /// add(x, y) -> x + y.
    fn add<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f32>, y: PyReadonlyArray1<'py, f32>) -> PyResult<F32Out<'py>> {
        let (x, y) = (slice(&x, "x")?, slice(&y, "y")?);
        Ok(run!(self, py, add(x, y))?.into_pyarray(py))
    }

    /// embed(wtype, table, n_vocab, dim, tokens) -> rows [len(tokens)·dim].
    fn embed<'py>(&self, py: Python<'py>, wtype: &str, table: PyReadonlyArrayDyn<'py, u8>, n_vocab: usize, dim: usize, tokens: PyReadonlyArray1<'py, u32>) -> PyResult<F32Out<'py>> {
        let t = gtype(wtype)?;
        let table = blocks(&table, "table")?;
        let tokens = slice(&tokens, "tokens")?;
        Ok(run!(self, py, embed(t, table, n_vocab, dim, tokens))?.into_pyarray(py))
    }

    /// gather_rows(x, dim, rows) -> x[rows] (rows of dim).
    fn gather_rows<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f32>, dim: usize, rows: PyReadonlyArray1<'py, u32>) -> PyResult<F32Out<'py>> {
        let (x, rows) = (slice(&x, "x")?, slice(&rows, "rows")?);
        Ok(run!(self, py, gather_rows(x, dim, rows))?.into_pyarray(py))
    }

    /// matmul_multi(wtypes, ws, n_outs, k, x, biases) -> list of y: several matrices of one input
    /// through the trait's `matmul_multi` (one GEMV launch for Q/K/V on CUDA).
    #[allow(clippy::too_many_arguments)]
    fn matmul_multi<'py>(&self, py: Python<'py>, wtypes: Vec<String>, ws: Vec<PyReadonlyArrayDyn<'py, u8>>, n_outs: Vec<usize>, k: usize, x: PyReadonlyArray1<'py, f32>, biases: Vec<Option<PyReadonlyArray1<'py, f32>>>) -> PyResult<Vec<F32Out<'py>>> {
        if wtypes.len() != ws.len() || ws.len() != n_outs.len() || ws.len() != biases.len() {
            return Err(to_py(FakError::invalid("ws", "wtypes, ws, n_outs and biases must have one entry per matrix")));
        }
        let ts = wtypes.iter().map(|t| gtype(t)).collect::<PyResult<Vec<_>>>()?;
        let wsl = ws.iter().map(|w| blocks(w, "w")).collect::<PyResult<Vec<_>>>()?;
        let bsl = biases.iter().map(|b| b.as_ref().map(|b| slice(b, "bias")).transpose()).collect::<PyResult<Vec<_>>>()?;
        let x = slice(&x, "x")?;
        let spec: Vec<optest::MatrixCase<'_>> = (0..ts.len()).map(|i| (ts[i], wsl[i], n_outs[i], bsl[i])).collect();
        let outs = run!(self, py, matmul_multi(&spec, k, x))?;
        Ok(outs.into_iter().map(|o| o.into_pyarray(py)).collect())
    }

    /// head_norm(x, w, eps) -> x with each `len(w)`-element row RMS-normalized in place
    /// (`Backend::rmsnorm_inplace`, Qwen3's per-head Q/K norm).
    fn head_norm<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f32>, w: PyReadonlyArray1<'py, f32>, eps: f32) -> PyResult<F32Out<'py>> {
        let (x, w) = (slice(&x, "x")?, slice(&w, "w")?);
        Ok(run!(self, py, head_norm(x, w, eps))?.into_pyarray(py))
    }

    /// delta_net(h, d, d_conv, d_state, n_k, n_v, eps, qkv, gate, beta, alpha, conv, dt_bias, a,
    /// norm, out, seqs, n_slots, state0) -> (y, states): one Gated DeltaNet layer
    /// (`Backend::delta_net`) with f32 weights (row-major GGUF rows: `qkv` `[conv_dim·d]`, `gate`
    /// `[value_dim·d]`, `beta` / `alpha` `[n_v·d]`, `conv` `[conv_dim·d_conv]`, `out`
    /// `[d·value_dim]`) on `h` `[n_rows·d]` for `seqs` (`(n_rows, n_past, state slot)` each, rows
    /// in order) from the recurrent states `state0` `[n_slots·state_len]`; returns the output
    /// `[n_rows·d]` and the states after it.
    #[allow(clippy::too_many_arguments)]
    fn delta_net<'py>(
        &self,
        py: Python<'py>,
        h: PyReadonlyArray1<'py, f32>,
        d: usize,
        d_conv: usize,
        d_state: usize,
        n_k: usize,
        n_v: usize,
        eps: f32,
        qkv: PyReadonlyArray1<'py, f32>,
        gate: PyReadonlyArray1<'py, f32>,
        beta: PyReadonlyArray1<'py, f32>,
        alpha: PyReadonlyArray1<'py, f32>,
        conv: PyReadonlyArray1<'py, f32>,
        dt_bias: PyReadonlyArray1<'py, f32>,
        a: PyReadonlyArray1<'py, f32>,
        norm: PyReadonlyArray1<'py, f32>,
        out: PyReadonlyArray1<'py, f32>,
        seqs: Vec<(usize, usize, usize)>,
        n_slots: usize,
        state0: PyReadonlyArray1<'py, f32>,
    ) -> PyResult<(F32Out<'py>, F32Out<'py>)> {
        let c = optest::DeltaNetCase {
            d,
            d_conv,
            d_state,
            n_k,
            n_v,
            eps,
            qkv: slice(&qkv, "qkv")?,
            gate: slice(&gate, "gate")?,
            beta: slice(&beta, "beta")?,
            alpha: slice(&alpha, "alpha")?,
            conv: slice(&conv, "conv")?,
            dt_bias: slice(&dt_bias, "dt_bias")?,
            a: slice(&a, "a")?,
            norm: slice(&norm, "norm")?,
            out: slice(&out, "out")?,
        };
        let (h, s0) = (slice(&h, "h")?, slice(&state0, "state0")?);
        let (y, st) = run!(self, py, delta_net(&c, h, &seqs, n_slots, s0))?;
        Ok((y.into_pyarray(py), st.into_pyarray(py)))
    }

    /// moe_ffn(h, res, d, n_ff, n_expert, k, gate_inp, gate_type, gate, up_type, up, down_type,
    /// down) -> (res + MoE FFN(h), ids, weights): `Backend::moe_ffn` on float32 `h`/`res`
    /// `[n_rows·d]`, the f32 router `gate_inp` `[n_expert·d]` and uint8 GGUF blocks of the
    /// stacked experts (`gate`/`up`: n_expert × n_ff rows of d; `down`: n_expert × d rows of n_ff).
    #[allow(clippy::too_many_arguments)]
    fn moe_ffn<'py>(&self, py: Python<'py>, h: PyReadonlyArray1<'py, f32>, res: PyReadonlyArray1<'py, f32>, d: usize, n_ff: usize, n_expert: usize, k: usize, gate_inp: PyReadonlyArray1<'py, f32>, gate_type: &str, gate: PyReadonlyArrayDyn<'py, u8>, up_type: &str, up: PyReadonlyArrayDyn<'py, u8>, down_type: &str, down: PyReadonlyArrayDyn<'py, u8>) -> PyResult<(F32Out<'py>, F32Out<'py>, F32Out<'py>)> {
        let (h, res, gi) = (slice(&h, "h")?, slice(&res, "res")?, slice(&gate_inp, "gate_inp")?);
        let (g, u, dn) = ((gtype(gate_type)?, blocks(&gate, "experts")?), (gtype(up_type)?, blocks(&up, "experts")?), (gtype(down_type)?, blocks(&down, "experts")?));
        let (o, ids, w) = run!(self, py, moe_ffn(h, res, d, n_ff, n_expert, k, gi, g, u, dn))?;
        Ok((o.into_pyarray(py), ids.into_pyarray(py), w.into_pyarray(py)))
    }

    /// matmul_add(wtype, w, n_out, k, x, res, bias=None) -> res + x·Wᵀ (+ bias), through the
    /// trait's `matmul_add` (the residual add fused into the matmul on CUDA).
    #[pyo3(signature = (wtype, w, n_out, k, x, res, bias=None))]
    #[allow(clippy::too_many_arguments)]
    fn matmul_add<'py>(&self, py: Python<'py>, wtype: &str, w: PyReadonlyArrayDyn<'py, u8>, n_out: usize, k: usize, x: PyReadonlyArray1<'py, f32>, res: PyReadonlyArray1<'py, f32>, bias: Option<PyReadonlyArray1<'py, f32>>) -> PyResult<F32Out<'py>> {
        let t = gtype(wtype)?;
        let w = blocks(&w, "w")?;
        let (x, res) = (slice(&x, "x")?, slice(&res, "res")?);
        let bias = bias.as_ref().map(|b| slice(b, "bias")).transpose()?;
        Ok(run!(self, py, matmul_add(t, w, n_out, k, x, res, bias))?.into_pyarray(py))
    }

    /// rope_kv_write(q, k, v, n_past, table, n_head, n_head_kv, head_dim, style, n_rot, freq_base,
    /// freq_scale, freq_factors=None, ext_factor=0.0, attn_factor=1.0, yarn_orig_ctx=0) -> (q rotated,
    /// K read back, V read back): the trait's `rope_kv_write` for one sequence at positions n_past..
    /// with block table `table`; the YaRN arguments as in `rope`.
    #[pyo3(signature = (q, k, v, n_past, table, n_head, n_head_kv, head_dim, style, n_rot, freq_base, freq_scale, freq_factors=None, ext_factor=0.0, attn_factor=1.0, yarn_orig_ctx=0))]
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write<'py>(&self, py: Python<'py>, q: PyReadonlyArray1<'py, f32>, k: PyReadonlyArray1<'py, f32>, v: PyReadonlyArray1<'py, f32>, n_past: usize, table: PyReadonlyArray1<'py, u32>, n_head: usize, n_head_kv: usize, head_dim: usize, style: &str, n_rot: usize, freq_base: f32, freq_scale: f32, freq_factors: Option<PyReadonlyArray1<'py, f32>>, ext_factor: f32, attn_factor: f32, yarn_orig_ctx: usize) -> PyResult<(F32Out<'py>, F32Out<'py>, F32Out<'py>)> {
        let p = rope_params(rope_style(style)?, n_rot, freq_base, freq_scale, ext_factor, attn_factor, yarn_orig_ctx);
        let a = AttnParams { n_head, n_head_kv, head_dim, scale: 1.0 / (head_dim as f32).sqrt(), window: None };
        let (q, k, v, table) = (slice(&q, "q")?, slice(&k, "k")?, slice(&v, "v")?, slice(&table, "table")?);
        let ff = freq_factors.as_ref().map(|f| slice(f, "freq_factors")).transpose()?;
        let (qo, kr, vr) = run!(self, py, rope_kv_write(q, k, v, n_past, table, &a, &p, ff))?;
        Ok((qo.into_pyarray(py), kr.into_pyarray(py), vr.into_pyarray(py)))
    }

    /// greedy(x, n_cols) -> (list[int], list[float]): per row the argmax and its log-softmax, through
    /// the trait's `greedy_rows` (on the device for CUDA).
    fn greedy(&self, py: Python<'_>, x: PyReadonlyArray1<'_, f32>, n_cols: usize) -> PyResult<(Vec<u32>, Vec<f32>)> {
        let x = slice(&x, "x")?;
        run!(self, py, greedy(x, n_cols))
    }

    /// top_rows(x, n_cols, rows, m) -> (ids, vals, max, z, exact): the trait's `top_rows` (the
    /// device sampling's candidates): per listed row its top m ids and logits (`[len(rows)·m]`),
    /// max, Σ e^(x − max) and whether the ids are exactly the host order's.
    #[allow(clippy::type_complexity)]
    fn top_rows(&self, py: Python<'_>, x: PyReadonlyArray1<'_, f32>, n_cols: usize, rows: Vec<u32>, m: usize) -> PyResult<(Vec<u32>, Vec<f32>, Vec<f32>, Vec<f64>, Vec<bool>)> {
        let x = slice(&x, "x")?;
        let t = run!(self, py, top_rows(x, n_cols, &rows, m))?;
        Ok((t.ids, t.vals, t.max, t.z, t.exact))
    }

    /// penalize(x, n_cols, entries) -> (penalized x, values before): the trait's `penalize_rows`
    /// with entries `(row, token, repeat, delta)`.
    fn penalize<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f32>, n_cols: usize, entries: Vec<(u32, u32, f32, f32)>) -> PyResult<(F32Out<'py>, Vec<f32>)> {
        let x = slice(&x, "x")?;
        let pens: Vec<LogitPenalty> = entries.into_iter().map(|(row, token, repeat, delta)| LogitPenalty { row, token, repeat, delta }).collect();
        let (out, raw) = run!(self, py, penalize(x, n_cols, &pens))?;
        Ok((out.into_pyarray(py), raw))
    }

    /// draw(x, n_cols, draws) -> (tokens, logits, max, z): the trait's `draw_rows` with draws
    /// `(row, 1/temperature, uniform)`; per draw the token, its logit, and the row's max and
    /// Σ e^(x − max).
    #[allow(clippy::type_complexity)]
    fn draw(&self, py: Python<'_>, x: PyReadonlyArray1<'_, f32>, n_cols: usize, draws: Vec<(u32, f32, f64)>) -> PyResult<(Vec<u32>, Vec<f32>, Vec<f32>, Vec<f64>)> {
        let x = slice(&x, "x")?;
        let d: Vec<DrawRequest> = draws.into_iter().map(|(row, inv_temp, u)| DrawRequest { row, inv_temp, u }).collect();
        let o = run!(self, py, draw(x, n_cols, &d))?;
        Ok((o.tokens, o.vals, o.max, o.z))
    }

    /// set_matmul_variant(variant) pins the CUDA quantized-matmul kernel for every later product
    /// of this process: "gemv", "tc:<BN>:<G>:<splits>" (splits 0: automatic), "decode" (the
    /// measured table's decode-step choices), or None (the choices outside decode steps, which
    /// OpRunner's ops run by default). Raises ValueError for another string (a no-op on the CPU
    /// runner).
    #[pyo3(signature = (variant=None))]
    fn set_matmul_variant(&self, variant: Option<&str>) -> PyResult<()> {
        #[cfg(feature = "cuda")]
        {
            use crate::backend::cuda::matmul_plan;
            let decode = variant == Some("decode");
            let choice = variant
                .filter(|_| !decode)
                .map(|v| matmul_plan::parse(v).ok_or_else(|| to_py(FakError::invalid("variant", format!("{v:?} (expected \"gemv\", \"tc:<16|32|64>:<1|2>:<splits>\", \"st:<16|32|64>:<2|3>:<splits>\", \"fr:<16|32|64>:<2|3>:<splits>\" or \"decode\")")))))
                .transpose()?;
            matmul_plan::force(choice);
            matmul_plan::force_decode(decode);
        }
        #[cfg(not(feature = "cuda"))]
        let _ = variant;
        Ok(())
    }

    /// time_matmul(wtype, w, n_out, k, x, cases, iters=10, reps=3) -> list[float]: seconds one
    /// product of the first `n_rows` rows of `x` takes on the GPU for each case
    /// `(n_rows, variant)` (variant as for set_matmul_variant; None: the decode-step table's): `iters`
    /// products in a CUDA graph, the median of `reps` replays. CUDA runner only.
    #[pyo3(signature = (wtype, w, n_out, k, x, cases, iters=10, reps=3))]
    #[allow(clippy::too_many_arguments)]
    fn time_matmul<'py>(&self, py: Python<'py>, wtype: &str, w: PyReadonlyArrayDyn<'py, u8>, n_out: usize, k: usize, x: PyReadonlyArray1<'py, f32>, cases: Vec<(usize, Option<String>)>, iters: usize, reps: usize) -> PyResult<Vec<f64>> {
        let t = gtype(wtype)?;
        let w = blocks(&w, "w")?;
        let x = slice(&x, "x")?;
        match &self.runner {
            #[cfg(feature = "cuda")]
            Runner::Cuda(b) => {
                use crate::backend::cuda::matmul_plan;
                let mut parsed = Vec::with_capacity(cases.len());
                for (n, v) in &cases {
                    let c = v.as_deref().map(|v| matmul_plan::parse(v).ok_or_else(|| to_py(FakError::invalid("variant", format!("{v:?}"))))).transpose()?;
                    parsed.push((*n, c));
                }
                matmul_plan::force_decode(true);
                let r = detach(py, || b.time_matmul(t, w, n_out, k, x, &parsed, iters, reps));
                matmul_plan::force_decode(false);
                r
            }
            _ => {
                let _ = (py, t, w, x, cases, iters, reps);
                Err(to_py(FakError::invalid("backend", "time_matmul needs the CUDA runner")))
            }
        }
    }

    /// argmax(x, n_cols) -> list[int] per row.
    fn argmax(&self, py: Python<'_>, x: PyReadonlyArray1<'_, f32>, n_cols: usize) -> PyResult<Vec<u32>> {
        let x = slice(&x, "x")?;
        run!(self, py, argmax(x, n_cols))
    }

    /// attention(seqs, n_head, n_head_kv, head_dim, block_perm, q, k, v, window=0) -> (out, k_read,
    /// v_read): `seqs` a list of (n_past, n_rows); K/V of every position written with kv_write
    /// (blocks assigned from `block_perm` in order), then attention of the new rows. `window` > 0:
    /// sliding-window attention over the last `window` positions, with the blocks wholly before a
    /// sequence's window pointed at a block of +inf K/V (a read of one gives NaN).
    #[pyo3(signature = (seqs, n_head, n_head_kv, head_dim, block_perm, q, k, v, window=0))]
    #[allow(clippy::too_many_arguments)]
    fn attention<'py>(&self, py: Python<'py>, seqs: Vec<(usize, usize)>, n_head: usize, n_head_kv: usize, head_dim: usize, block_perm: PyReadonlyArray1<'py, u32>, q: PyReadonlyArray1<'py, f32>, k: PyReadonlyArray1<'py, f32>, v: PyReadonlyArray1<'py, f32>, window: u32) -> PyResult<Bound<'py, PyList>> {
        let perm = slice(&block_perm, "block_perm")?;
        let (q, k, v) = (slice(&q, "q")?, slice(&k, "k")?, slice(&v, "v")?);
        let case = AttnCase { seqs: &seqs, n_head, n_head_kv, head_dim, block_perm: perm, window: (window > 0).then_some(window) };
        let (o, kr, vr) = run!(self, py, attention(&case, q, k, v))?;
        PyList::new(py, [o.into_pyarray(py), kr.into_pyarray(py), vr.into_pyarray(py)])
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_info, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_devices, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_memory, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_kernel_families, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_nvrtc_compile, m)?)?;
    m.add_class::<PyOpRunner>()
}

/// The op runners' RoPE parameters: linear, or YaRN (`ext_factor` ≠ 0) with correction
/// dimensions from `yarn_orig_ctx` and llama.cpp's β_fast = 32, β_slow = 1.
fn rope_params(style: RopeStyle, n_rot: usize, freq_base: f32, freq_scale: f32, ext_factor: f32, attn_factor: f32, yarn_orig_ctx: usize) -> RopeParams {
    let mut p = RopeParams::linear(style, n_rot, freq_base, freq_scale);
    p.ext_factor = ext_factor;
    p.attn_factor = attn_factor;
    if ext_factor != 0.0 {
        p.corr_dims = RopeParams::yarn_corr_dims(n_rot, yarn_orig_ctx, freq_base, 32.0, 1.0);
    }
    p
}
