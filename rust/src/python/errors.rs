//! The Python exception tree mirrored from [`crate::FakError`]: one class per variant, all under
//! `fak.FakError`, each carrying its variant's fields as attributes (`param`, `n_tokens`, `n_ctx`,
//! ...), so that callers (the gateway) read the field at fault instead of parsing the message.

use crate::FakError as CoreError;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(fak, FakError, PyException, "Base class of every error fak raises.");
pyo3::create_exception!(fak, GGUFError, FakError, "A GGUF file is malformed or unsupported; the message names the problem and the byte offset.");
pyo3::create_exception!(fak, UnsupportedError, FakError, "A tensor type, architecture or feature fak does not implement.");
pyo3::create_exception!(fak, ModelError, FakError, "A model file is readable but inconsistent (missing tensor, wrong shape, bad hyper-parameter).");
pyo3::create_exception!(fak, ContextLengthError, FakError, "A request does not fit in the context window. Attributes: param (the argument at fault: \"prompt_ids\", \"max_tokens\" or \"token_ids\"), n_prompt (prompt tokens), max_tokens (the tokens asked for beyond the prompt, or None), n_tokens (n_prompt + max_tokens), n_ctx (the window, tokens); None when raised without them.");
pyo3::create_exception!(fak, KVCacheFullError, FakError, "The KV cache has no room for another sequence or token. Attributes: needed, free (KV blocks); None when raised without them.");
pyo3::create_exception!(fak, ShardError, UnsupportedError, "A model cannot be split into the requested tensor-parallel shards (a tensor would be cut inside a quantization block, or a shard would get no head or FFN column); the message names the tensor, its format and the shard count.");
pyo3::create_exception!(fak, BackendError, FakError, "A compute backend failed (no usable GPU, CUDA driver error, kernel load).");

const INVALID_ARGUMENT_DOC: &str = "An argument is out of range or of the wrong kind (a FakError and a ValueError). \
Attribute: param, the argument at fault as the engine names it (\"temperature\", \"prompt_ids\", \"stop\", ...); \
None when raised without it.";

static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `fak.InvalidArgumentError`, a subclass of both `fak.FakError` and `ValueError` (which
/// `create_exception!` cannot make: it takes one base), created on first use.
fn invalid_argument_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    INVALID_ARGUMENT
        .get_or_try_init(py, || {
            let bases = PyTuple::new(py, [py.get_type::<FakError>(), py.get_type::<PyValueError>()])?;
            let ns = PyDict::new(py);
            ns.set_item("__module__", "fak")?;
            ns.set_item("__doc__", INVALID_ARGUMENT_DOC)?;
            ns.set_item("param", py.None())?;
            let ty = py.get_type::<PyType>().call1(("InvalidArgumentError", bases, ns))?;
            Ok::<_, PyErr>(ty.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py))
}

/// Converts a core error into the Python exception of its class, its fields set as attributes.
pub(crate) fn to_py(e: CoreError) -> PyErr {
    let msg = e.to_string();
    Python::attach(|py| {
        let err = match &e {
            CoreError::Gguf { .. } => GGUFError::new_err(msg),
            CoreError::Io(_) => pyo3::exceptions::PyOSError::new_err(msg),
            CoreError::Unsupported(_) => UnsupportedError::new_err(msg),
            CoreError::Model(_) => ModelError::new_err(msg),
            CoreError::ContextLength { .. } => ContextLengthError::new_err(msg),
            CoreError::KvCacheFull { .. } => KVCacheFullError::new_err(msg),
            CoreError::InvalidArgument { .. } => match invalid_argument_type(py) {
                Ok(ty) => PyErr::from_type(ty.clone(), msg),
                Err(failed) => return failed,
            },
            CoreError::Backend { .. } => BackendError::new_err(msg),
            CoreError::Shard { .. } => ShardError::new_err(msg),
        };
        match set_fields(py, &err, &e) {
            Ok(()) => err,
            Err(failed) => failed,
        }
    })
}

/// The variant's fields as attributes of the exception value.
fn set_fields(py: Python<'_>, err: &PyErr, e: &CoreError) -> PyResult<()> {
    let value = err.value(py);
    match e {
        CoreError::ContextLength { param, n_prompt, max_tokens, n_ctx } => {
            value.setattr("param", param)?;
            value.setattr("n_prompt", n_prompt)?;
            value.setattr("max_tokens", max_tokens)?;
            value.setattr("n_tokens", e.n_tokens())?;
            value.setattr("n_ctx", n_ctx)?;
        }
        CoreError::KvCacheFull { needed, free } => {
            value.setattr("needed", needed)?;
            value.setattr("free", free)?;
        }
        CoreError::InvalidArgument { param, .. } => value.setattr("param", param)?,
        _ => {}
    }
    Ok(())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let context = py.get_type::<ContextLengthError>();
    for name in ["param", "n_prompt", "max_tokens", "n_tokens", "n_ctx"] {
        context.setattr(name, py.None())?;
    }
    let kv = py.get_type::<KVCacheFullError>();
    kv.setattr("needed", py.None())?;
    kv.setattr("free", py.None())?;
    m.add("FakError", py.get_type::<FakError>())?;
    m.add("GGUFError", py.get_type::<GGUFError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("ContextLengthError", context)?;
    m.add("KVCacheFullError", kv)?;
    m.add("InvalidArgumentError", invalid_argument_type(py)?)?;
    m.add("BackendError", py.get_type::<BackendError>())?;
    m.add("ShardError", py.get_type::<ShardError>())?;
    Ok(())
}
