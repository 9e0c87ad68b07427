//! Python binding of the GGUF reader and the dequantizers: `fak._native.GgufFile` and
//! `fak._native.dequantize`. `fak.gguf.GGUFFile` (python/fak/gguf.py) is the public wrapper.

use std::path::PathBuf;
use std::sync::Arc;

use numpy::ndarray::{ArrayView1, IxDyn};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::IntoPyObjectExt;

use super::{detach, to_py};
use crate::gguf::{GgufFile, MetaArray, MetaValue, TensorInfo};
use crate::quant::{self, GgmlType};
use crate::FakError;

/// An open GGUF file (memory-mapped; the header parsed at open, tensor data never copied).
#[pyclass(name = "GgufFile", module = "fak._native", frozen)]
pub struct PyGgufFile {
    inner: Arc<GgufFile>,
}

impl PyGgufFile {
    /// The shared reader, for other binding modules.
    #[allow(dead_code)]
    pub(crate) fn inner(&self) -> &Arc<GgufFile> {
        &self.inner
    }

    fn info(&self, name: &str) -> PyResult<&TensorInfo> {
        self.inner.tensor(name).ok_or_else(|| {
            PyKeyError::new_err(format!("no tensor named {name:?} in this GGUF file"))
        })
    }
}

fn array_to_py<'py>(py: Python<'py>, a: &MetaArray) -> PyResult<Bound<'py, PyAny>> {
    let list = match a {
        MetaArray::U8(v) => PyList::new(py, v)?,
        MetaArray::I8(v) => PyList::new(py, v)?,
        MetaArray::U16(v) => PyList::new(py, v)?,
        MetaArray::I16(v) => PyList::new(py, v)?,
        MetaArray::U32(v) => PyList::new(py, v)?,
        MetaArray::I32(v) => PyList::new(py, v)?,
        MetaArray::F32(v) => PyList::new(py, v)?,
        MetaArray::Bool(v) => PyList::new(py, v)?,
        MetaArray::String(v) => PyList::new(py, v)?,
        MetaArray::U64(v) => PyList::new(py, v)?,
        MetaArray::I64(v) => PyList::new(py, v)?,
        MetaArray::F64(v) => PyList::new(py, v)?,
        MetaArray::Array(v) => {
            let items = v
                .iter()
                .map(|inner| array_to_py(py, inner))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?
        }
    };
    Ok(list.into_any())
}

fn value_to_py<'py>(py: Python<'py>, v: &MetaValue) -> PyResult<Bound<'py, PyAny>> {
    match v {
        MetaValue::U8(x) => x.into_bound_py_any(py),
        MetaValue::I8(x) => x.into_bound_py_any(py),
        MetaValue::U16(x) => x.into_bound_py_any(py),
        MetaValue::I16(x) => x.into_bound_py_any(py),
        MetaValue::U32(x) => x.into_bound_py_any(py),
        MetaValue::I32(x) => x.into_bound_py_any(py),
        MetaValue::F32(x) => x.into_bound_py_any(py),
        MetaValue::Bool(x) => x.into_bound_py_any(py),
        MetaValue::String(x) => x.into_bound_py_any(py),
        MetaValue::U64(x) => x.into_bound_py_any(py),
        MetaValue::I64(x) => x.into_bound_py_any(py),
        MetaValue::F64(x) => x.into_bound_py_any(py),
        MetaValue::Array(a) => array_to_py(py, a),
    }
}

#[pymethods]
impl PyGgufFile {
    /// Maps `path` and parses its header (GIL released). Raises `fak.GGUFError` for a malformed
    /// file, `OSError` when it cannot be opened.
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let f = detach(py, move || GgufFile::open(&path))?;
        Ok(PyGgufFile { inner: Arc::new(f) })
    }

    /// Parses a GGUF file held in `data` (copied once into Rust memory).
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        let bytes = data.to_vec();
        let f = detach(py, move || GgufFile::from_bytes(bytes))?;
        Ok(PyGgufFile { inner: Arc::new(f) })
    }

    /// GGUF version (2 or 3).
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version()
    }

    /// Data-section alignment in bytes.
    #[getter]
    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    /// Absolute byte offset of the data section.
    #[getter]
    fn data_offset(&self) -> u64 {
        self.inner.data_offset()
    }

    /// File size in bytes.
    #[getter]
    fn file_size(&self) -> u64 {
        self.inner.file_size()
    }

    /// Metadata as a dict in file order: key -> Python value (int, float, bool, str, list).
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.metadata() {
            d.set_item(k, value_to_py(py, v)?)?;
        }
        Ok(d)
    }

    /// Metadata types: key -> GGUF type name (`"UINT32"`, `"ARRAY[STRING]"`, ...).
    fn metadata_types<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.metadata() {
            d.set_item(k, v.type_name())?;
        }
        Ok(d)
    }

    /// Tensor infos in file order: `(name, dims in ggml order, type name, absolute offset,
    /// n_bytes, n_elements)`.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .tensors()
            .iter()
            .map(|t| {
                let dims = PyTuple::new(py, &t.dims)?;
                (
                    t.name.as_str(),
                    dims,
                    t.ggml_type.name(),
                    t.offset,
                    t.n_bytes,
                    t.n_elements,
                )
                    .into_pyobject(py)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// The tensor's blocks as a read-only 1-D uint8 numpy view of the map (zero copy). The view's
    /// base is this object, so the map stays alive as long as any view does. `KeyError` when no
    /// tensor has that name.
    fn raw<'py>(slf: &Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let this = slf.get();
        let data = this.inner.tensor_data(this.info(name)?);
        let view = ArrayView1::from(data);
        // SAFETY: `data` borrows the read-only map owned by `this.inner`; the array's base object
        // is `slf`, which owns that `Arc`, so the map outlives the array. The map is never
        // remapped or written, and the array is made non-writeable before it is returned.
        let arr = unsafe { PyArray1::borrow_from_array(&view, slf.clone().into_any()) };
        arr.try_readwrite()?.make_nonwriteable();
        Ok(arr)
    }

    /// The tensor dequantized to a 1-D float32 array of `n_elements` values (ggml order, i.e.
    /// row-major over the reversed dims), GIL released. `KeyError` for an unknown name,
    /// `fak.UnsupportedError` for a type without a dequantizer.
    fn dequantize<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let info = self.info(name)?;
        if !quant::can_dequantize(info.ggml_type) {
            return Err(to_py(FakError::Unsupported(format!(
                "dequantization of ggml type {} (tensor {name:?})",
                info.ggml_type.name()
            ))));
        }
        let n = usize::try_from(info.n_elements)
            .map_err(|_| PyValueError::new_err("tensor too large"))?;
        let out = PyArray1::<f32>::zeros(py, n, false);
        // SAFETY: `out` is a fresh array that nothing else references yet.
        let dst = unsafe { out.as_slice_mut()? };
        let src = self.inner.tensor_data(info);
        let t = info.ggml_type;
        detach(py, move || quant::dequantize(t, src, dst))?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        let path = self
            .inner
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "<bytes>".into());
        format!(
            "GgufFile({path:?}, version={}, n_tensors={}, n_metadata={})",
            self.inner.version(),
            self.inner.tensors().len(),
            self.inner.metadata().len()
        )
    }
}

/// Dequantizes `raw` (whole blocks of ggml type `type_name`, as bytes or a contiguous uint8 numpy
/// array) into float32, GIL released: into `out` (a writeable contiguous float32 array of
/// `n_elements`) when given, else into a new 1-D array. Returns the array written.
/// `ValueError` for an unknown type name, a bad `out`, or a length mismatch;
/// `fak.UnsupportedError` for a type without a dequantizer.
#[pyfunction]
#[pyo3(signature = (type_name, raw, n_elements, out=None))]
fn dequantize<'py>(
    py: Python<'py>,
    type_name: &str,
    raw: &Bound<'py, PyAny>,
    n_elements: usize,
    out: Option<Bound<'py, PyArrayDyn<f32>>>,
) -> PyResult<Bound<'py, PyAny>> {
    let t = GgmlType::from_name(type_name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown ggml type name {type_name:?}")))?;
    let out = match out {
        Some(o) => {
            if o.len() != n_elements {
                return Err(PyValueError::new_err(format!(
                    "out has {} elements, expected n_elements = {n_elements}",
                    o.len()
                )));
            }
            o
        }
        None => PyArrayDyn::<f32>::zeros(py, IxDyn(&[n_elements]), false),
    };
    let mut guard = out.try_readwrite().map_err(|_| {
        PyValueError::new_err("out must be a writeable float32 array not borrowed elsewhere")
    })?;
    let dst = guard
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("out must be a C-contiguous float32 array"))?;
    if let Ok(b) = raw.cast::<PyBytes>() {
        let src = b.as_bytes();
        detach(py, move || quant::dequantize(t, src, dst))?;
    } else {
        let a: PyReadonlyArrayDyn<'py, u8> = raw
            .extract()
            .map_err(|_| PyValueError::new_err("raw must be bytes or a numpy uint8 array"))?;
        let src = a
            .as_slice()
            .map_err(|_| PyValueError::new_err("raw must be a C-contiguous uint8 array"))?;
        detach(py, move || quant::dequantize(t, src, dst))?;
    }
    drop(guard);
    Ok(out.into_any())
}

/// Registers the GGUF binding in `fak._native`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGgufFile>()?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    Ok(())
}
