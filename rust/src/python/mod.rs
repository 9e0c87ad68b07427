//! The PyO3 boundary: the extension module `fak._native`. Only type conversion, error mapping and
//! GIL release live here; each binding file registers its classes and functions.

use pyo3::prelude::*;

mod cuda;
mod errors;
mod gguf;
mod limits;
mod model;
mod ops;

pub(crate) use errors::to_py;

/// Runs `f` with the GIL released and converts its error into the matching Python exception.
/// Every long-running call into the core goes through here.
#[allow(dead_code)]
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: Send + FnOnce() -> crate::Result<T>,
    T: Send,
{
    py.detach(f).map_err(to_py)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    gguf::register(m)?;
    ops::register(m)?;
    model::register(m)?;
    limits::register(m)?;
    cuda::register(m)?;
    Ok(())
}
