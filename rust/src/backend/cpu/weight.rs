//! CPU weights: matrices stay in their GGUF blocks inside the file's memory map (no copy, so the
//! resident set grows only by the pages a forward touches); 1-D tensors (norm weights, biases,
//! RoPE frequency factors) are widened to f32 once at load.

use std::any::Any;
use std::sync::Arc;

use crate::backend::HostTensor;
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// Bytes borrowed from a buffer kept alive by `owner` (a memory-mapped GGUF file).
struct MappedBytes {
    ptr: *const u8,
    len: usize,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the bytes are immutable for as long as `_owner` lives (a read-only map or an owned
// buffer that is never written after load), and `_owner` itself is `Send + Sync`.
unsafe impl Send for MappedBytes {}
unsafe impl Sync for MappedBytes {}

impl MappedBytes {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` was a valid `&[u8]` into memory owned by `_owner` when this value
        // was built (see `CpuWeight::from_host`), `_owner` is held here so the memory stays mapped,
        // and nothing writes it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

enum WeightData {
    Mapped(MappedBytes),
    F32(Vec<f32>),
}

/// A weight as the CPU backend holds it.
pub struct CpuWeight {
    /// Name in the GGUF file.
    pub name: String,
    /// Block format of [`CpuWeight::bytes`]; `F32` for widened vectors.
    pub wtype: GgmlType,
    /// Shape in ggml order (`[k, n_out]` for a matrix, `[n]` for a vector).
    pub dims: Vec<usize>,
    data: WeightData,
}

impl CpuWeight {
    /// Takes `t` from the loader: 1-D tensors are widened to f32, others keep borrowing the
    /// mapped blocks (held alive through `t.owner`).
    ///
    /// Errors: [`FakError::Model`] when the byte count does not match the shape and type.
    pub fn from_host(t: &HostTensor<'_>) -> Result<CpuWeight> {
        let n_elements: usize = t.dims.iter().product();
        let row = t.dims.first().copied().unwrap_or(1);
        let expected = t
            .wtype
            .row_bytes(row as u64)
            .map(|rb| rb as usize * (n_elements / row.max(1)))
            .ok_or_else(|| {
                FakError::model(format!(
                    "tensor {}: {} elements per row is not a whole number of {} blocks",
                    t.name,
                    row,
                    t.wtype.name()
                ))
            })?;
        if t.data.len() != expected {
            return Err(FakError::model(format!(
                "tensor {}: {} bytes of data, but shape {:?} of {} needs {expected}",
                t.name,
                t.data.len(),
                t.dims,
                t.wtype.name()
            )));
        }
        let data = if t.dims.len() <= 1 {
            let mut v = vec![0f32; n_elements];
            crate::quant::dequantize_row(t.wtype, t.data, &mut v)
                .map_err(|e| FakError::model(format!("tensor {}: {e}", t.name)))?;
            WeightData::F32(v)
        } else {
            WeightData::Mapped(MappedBytes {
                ptr: t.data.as_ptr(),
                len: t.data.len(),
                _owner: t.owner.clone(),
            })
        };
        let wtype = if matches!(data, WeightData::F32(_)) {
            GgmlType::F32
        } else {
            t.wtype
        };
        Ok(CpuWeight {
            name: t.name.to_string(),
            wtype,
            dims: t.dims.to_vec(),
            data,
        })
    }

    /// The raw blocks of a matrix weight, or the f32 bytes of a widened vector.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            WeightData::Mapped(m) => m.as_slice(),
            WeightData::F32(v) => {
                // SAFETY: any initialized f32 slice is a valid byte slice of 4× the length.
                unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4) }
            }
        }
    }

    /// The values of a widened 1-D weight.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            WeightData::F32(v) => Some(v),
            WeightData::Mapped(_) => None,
        }
    }

    /// Elements per row (`dims[0]`).
    pub fn k(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (`dims[1..]` product).
    pub fn n_out(&self) -> usize {
        self.dims.iter().skip(1).product()
    }

    /// Bytes of one row of `k()` elements.
    pub fn row_bytes(&self) -> usize {
        self.wtype.row_bytes(self.k() as u64).unwrap_or(0) as usize
    }
}
