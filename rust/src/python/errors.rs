//! The Python exception tree mirrored from [`crate::FakError`]: one class per variant, all under
//! `fak.FakError`; invalid arguments become `ValueError`.

use crate::FakError as CoreError;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(fak, FakError, PyException, "Base class of every error fak raises.");
pyo3::create_exception!(fak, GGUFError, FakError, "A GGUF file is malformed or unsupported; the message names the problem and the byte offset.");
pyo3::create_exception!(fak, UnsupportedError, FakError, "A tensor type, architecture or feature fak does not implement.");
pyo3::create_exception!(fak, ModelError, FakError, "A model file is readable but inconsistent (missing tensor, wrong shape, bad hyper-parameter).");
pyo3::create_exception!(fak, ContextLengthError, FakError, "A prompt (plus requested tokens) does not fit in the context window.");
pyo3::create_exception!(fak, KVCacheFullError, FakError, "The KV cache has no room for another sequence or token.");
pyo3::create_exception!(fak, ShardError, UnsupportedError, "A model cannot be split into the requested tensor-parallel shards (a tensor would be cut inside a quantization block, or a shard would get no head or FFN column); the message names the tensor, its format and the shard count.");
pyo3::create_exception!(fak, BackendError, FakError, "A compute backend failed (no usable GPU, CUDA driver error, kernel load).");

/// Converts a core error into the Python exception of its class.
pub(crate) fn to_py(e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        CoreError::Gguf { .. } => GGUFError::new_err(msg),
        CoreError::Io(_) => pyo3::exceptions::PyOSError::new_err(msg),
        CoreError::Unsupported(_) => UnsupportedError::new_err(msg),
        CoreError::Model(_) => ModelError::new_err(msg),
        CoreError::ContextLength { .. } => ContextLengthError::new_err(msg),
        CoreError::KvCacheFull { .. } => KVCacheFullError::new_err(msg),
        CoreError::InvalidArgument { .. } => PyValueError::new_err(msg),
        CoreError::Backend { .. } => BackendError::new_err(msg),
        CoreError::Shard { .. } => ShardError::new_err(msg),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FakError", py.get_type::<FakError>())?;
    m.add("GGUFError", py.get_type::<GGUFError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("ContextLengthError", py.get_type::<ContextLengthError>())?;
    m.add("KVCacheFullError", py.get_type::<KVCacheFullError>())?;
    m.add("BackendError", py.get_type::<BackendError>())?;
    m.add("ShardError", py.get_type::<ShardError>())?;
    Ok(())
}
