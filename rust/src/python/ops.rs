//! Bindings of single CPU ops for tests and benches: `matmul`, `simd_level`, `quantize_q8`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use numpy::{IntoPyArray, PyArray2, PyArrayMethods, PyUntypedArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::backend::cpu::matmul as mm;
use crate::quant::GgmlType;
use crate::FakError;

fn ggml_type(name: &str) -> Result<GgmlType, FakError> {
    GgmlType::from_name(name).ok_or_else(|| FakError::invalid("type_name", format!("unknown ggml type {name:?}")))
}

/// A rayon pool of `threads` threads, built once per size and reused (building one per call would
/// dominate a small matmul).
fn pool(threads: Option<usize>) -> Result<Arc<rayon::ThreadPool>, FakError> {
    static POOLS: Mutex<Option<HashMap<usize, Arc<rayon::ThreadPool>>>> = Mutex::new(None);
    let n = match threads {
        Some(0) => return Err(FakError::invalid("threads", "must be at least 1")),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    let mut guard = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(p) = map.get(&n) {
        return Ok(p.clone());
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("fak-cpu-{i}"))
        .build()
        .map_err(|e| FakError::Backend { backend: "cpu".into(), msg: format!("thread pool: {e}") })?;
    let p = Arc::new(p);
    map.insert(n, p.clone());
    Ok(p)
}

/// matmul(type_name, w, n_out, k, x, threads=None, level=None) -> np.ndarray float32 [n_rows, n_out]
///
/// `y = x · Wᵀ` with `W` given as GGUF blocks (`w`: contiguous uint8, `n_out` rows of `k` elements
/// of `type_name`) and `x` float32 `[n_rows, k]`. Runs in a rayon pool of `threads` (default: all
/// cores) with the GIL released; `level` ("scalar"/"avx2"/"avx512") forces a SIMD path.
/// Raises ValueError for bad shapes or a level the CPU lacks, fak.UnsupportedError for a type
/// without a kernel.
#[pyfunction]
#[pyo3(signature = (type_name, w, n_out, k, x, threads=None, level=None))]
#[allow(clippy::too_many_arguments)]
fn matmul<'py>(
    py: Python<'py>,
    type_name: &str,
    w: PyReadonlyArrayDyn<'py, u8>,
    n_out: usize,
    k: usize,
    x: PyReadonlyArray2<'py, f32>,
    threads: Option<usize>,
    level: Option<&str>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let t = ggml_type(type_name).map_err(super::to_py)?;
    let level = match level {
        None => None,
        Some(l) => Some(mm::SimdLevel::from_name(l).ok_or_else(|| super::to_py(FakError::invalid("level", format!("{l:?} is not scalar|avx2|avx512"))))?),
    };
    let ws = w.as_slice().map_err(|e| super::to_py(FakError::invalid("w", format!("must be contiguous: {e}"))))?;
    let xs = x.as_slice().map_err(|e| super::to_py(FakError::invalid("x", format!("must be C-contiguous: {e}"))))?;
    let [n_rows, xk] = [x.shape()[0], x.shape()[1]];
    if xk != k {
        return Err(super::to_py(FakError::invalid("x", format!("has {xk} columns, k is {k}"))));
    }
    let pool = pool(threads).map_err(super::to_py)?;
    let y = super::detach(py, || {
        let mut y = vec![0.0f32; n_rows * n_out];
        pool.install(|| match level {
            Some(l) => mm::matmul_at(l, t, ws, n_out, k, xs, n_rows, &mut y),
            None => mm::matmul(t, ws, n_out, k, xs, n_rows, &mut y),
        })?;
        Ok(y)
    })?;
    y.into_pyarray(py).reshape([n_rows, n_out])
}

/// simd_level() -> str: the SIMD path `matmul` runs by default ("avx512", "avx2" or "scalar").
#[pyfunction]
fn simd_level() -> &'static str {
    mm::simd_level()
}

/// simd_levels() -> list[str]: every SIMD path this CPU can run, lowest first.
#[pyfunction]
fn simd_levels() -> Vec<&'static str> {
    mm::available_levels().into_iter().map(|l| l.name()).collect()
}

/// quantize_q8(type_name, x) -> bytes: `x` (float32, 1-D) quantized to `type_name` ("Q8_0",
/// "Q8_1" or "Q8_K") in ggml's block byte layout, as `matmul` quantizes activations.
#[pyfunction]
fn quantize_q8<'py>(py: Python<'py>, type_name: &str, x: PyReadonlyArray1<'py, f32>) -> PyResult<Bound<'py, PyBytes>> {
    let t = ggml_type(type_name).map_err(super::to_py)?;
    let xs = x.as_slice().map_err(|e| super::to_py(FakError::invalid("x", format!("must be contiguous: {e}"))))?;
    let out = mm::quantize_activations(t, xs).map_err(super::to_py)?;
    Ok(PyBytes::new(py, &out))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(matmul, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(simd_levels, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_q8, m)?)?;
    Ok(())
}
