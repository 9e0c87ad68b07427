//! GGUF v2/v3 reader over a memory map: header, typed metadata, tensor infos, zero-copy tensor
//! data. Format: the GGUF spec (ggml `docs/gguf.md`); validity checks follow ggml's `gguf.cpp`.
//!
//! [`GgufFile::open`] maps the file and parses only the header (magic, version, metadata, tensor
//! infos); tensor data is never read or copied until a caller borrows it with
//! [`GgufFile::tensor_data`]. Every malformed input is a [`FakError::Gguf`] naming the problem
//! and the byte offset (see `parse.rs` for which offset each check reports); nothing panics.
//!
//! Tensor shapes are in **ggml order**: `dims[0]` is the fastest-varying (contiguous) axis, so a
//! weight matrix of `n_out` rows of `k` inputs has `dims = [k, n_out]`.

mod parse;
pub mod value;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use parse::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use value::{MetaArray, MetaValue, MetaValueType};

use crate::quant::{self, GgmlType};
use crate::{FakError, Result};

/// One tensor of a GGUF file, as its tensor info describes it (checked at open: the type is
/// known, rows are whole blocks, the data is aligned and lies inside the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `"blk.0.attn_q.weight"`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the contiguous axis. At most [`MAX_DIMS`] entries.
    pub dims: Vec<u64>,
    /// Block format of the data.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file (data-section offset + the info's offset).
    pub offset: u64,
    /// Bytes of data: `n_elements / block_size * type_size`.
    pub n_bytes: u64,
    /// Number of elements: the product of `dims` (1 for a tensor with no dimension).
    pub n_elements: u64,
}

impl TensorInfo {
    /// Elements per row: `dims[0]` (1 for a tensor with no dimension).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: `n_elements / row_len` (0 for an empty tensor).
    pub fn n_rows(&self) -> u64 {
        self.n_elements.checked_div(self.row_len()).unwrap_or(0)
    }

    /// Bytes per row: `row_len / block_size * type_size`.
    pub fn row_bytes(&self) -> u64 {
        self.ggml_type.row_bytes(self.row_len()).unwrap_or(0)
    }

    /// The shape in numpy / row-major order (slowest axis first): `dims` reversed.
    pub fn shape_row_major(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// The bytes a [`GgufFile`] reads from: a read-only memory map, or an owned buffer.
enum Storage {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Map(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open GGUF file: the parsed header plus the mapped bytes. `Send + Sync`; share it with `Arc`.
///
/// # Safety of the map
///
/// The file is mapped read-only. As with every mmap-based reader (llama.cpp, safetensors), a
/// process that truncates or rewrites the file while it is open makes later reads of the map
/// undefined (SIGBUS on truncation); fak never writes model files it has open.
pub struct GgufFile {
    storage: Storage,
    path: Option<PathBuf>,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_size", &self.file_size())
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` read-only and parses its header. Nothing beyond the header is read.
    ///
    /// Errors: [`FakError::Io`] when the file cannot be opened or mapped, [`FakError::Gguf`] when
    /// it is not a valid GGUF v2/v3 file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| {
            FakError::Io(std::io::Error::new(
                e.kind(),
                format!("cannot open {}: {e}", path.display()),
            ))
        })?;
        let len = file.metadata()?.len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this struct; see the type's "Safety of
            // the map" note on concurrent modification of the file by other processes.
            Storage::Map(unsafe { Mmap::map(&file)? })
        };
        Self::from_storage(storage, Some(path.to_path_buf()))
    }

    /// Parses a GGUF file held in memory (tests, fuzzing, files received over a pipe).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_storage(Storage::Owned(bytes), None)
    }

    fn from_storage(storage: Storage, path: Option<PathBuf>) -> Result<GgufFile> {
        let h = parse::parse_header(storage.bytes())?;
        Ok(GgufFile {
            storage,
            path,
            version: h.version,
            metadata: h.metadata,
            meta_index: h.meta_index,
            tensors: h.tensors,
            tensor_index: h.tensor_index,
            alignment: h.alignment,
            data_offset: h.data_offset,
        })
    }

    /// The path the file was opened from (`None` for [`GgufFile::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata key/values in file order, with their GGUF types.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the data section (end of the header rounded up to the alignment).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// File size in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// The whole file's bytes (borrowed from the map).
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// The tensor's raw blocks, borrowed from the map (zero copy): `info.n_bytes` bytes at
    /// `info.offset`. `info` must come from this file's [`GgufFile::tensors`]; an info whose
    /// range is not inside this file (one from another file) yields an empty slice.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let (Ok(start), Ok(n)) = (usize::try_from(info.offset), usize::try_from(info.n_bytes))
        else {
            return &[];
        };
        start
            .checked_add(n)
            .and_then(|end| self.storage.bytes().get(start..end))
            .unwrap_or(&[])
    }

    /// The tensor dequantized to f32, `n_elements` values in ggml order (row-major over the
    /// reversed dims). Errors: [`FakError::Unsupported`] for a type fak cannot dequantize.
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        if !quant::can_dequantize(info.ggml_type) {
            return Err(FakError::Unsupported(format!(
                "dequantization of ggml type {}",
                info.ggml_type.name()
            )));
        }
        let n = usize::try_from(info.n_elements)
            .map_err(|_| FakError::invalid("info", "tensor too large for this machine"))?;
        let mut out = vec![0f32; n];
        quant::dequantize(info.ggml_type, self.tensor_data(info), &mut out)?;
        Ok(out)
    }

    fn where_(&self) -> String {
        match &self.path {
            Some(p) => format!(" in {}", p.display()),
            None => String::new(),
        }
    }

    fn require(&self, key: &str) -> Result<&MetaValue> {
        self.get(key).ok_or_else(|| {
            FakError::model(format!("metadata key `{key}` is missing{}", self.where_()))
        })
    }

    fn wrong_type(&self, key: &str, v: &MetaValue, expected: &str) -> FakError {
        FakError::model(format!(
            "metadata key `{key}`{} has type {}, expected {expected}",
            self.where_(),
            v.type_name()
        ))
    }

    fn int<T: TryFrom<i128>>(&self, key: &str, v: &MetaValue, expected: &str) -> Result<T> {
        match v.as_integer() {
            Some(i) => T::try_from(i).map_err(|_| {
                FakError::model(format!(
                    "metadata key `{key}`{} = {i} does not fit in {expected}",
                    self.where_()
                ))
            }),
            None => Err(self.wrong_type(key, v, expected)),
        }
    }

    /// `key` as a u32: any GGUF integer type whose value fits. Errors: [`FakError::Model`] when
    /// missing, not an integer, or out of range.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.int(key, self.require(key)?, "UINT32")
    }

    /// `key` as a u64: any GGUF integer type whose value fits.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.int(key, self.require(key)?, "UINT64")
    }

    /// `key` as an i64: any GGUF integer type whose value fits.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.int(key, self.require(key)?, "INT64")
    }

    /// `key` as an f32: FLOAT32, or FLOAT64 rounded to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_float()
            .map(|f| f as f32)
            .ok_or_else(|| self.wrong_type(key, v, "FLOAT32"))
    }

    /// `key` as a string (STRING only).
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong_type(key, v, "STRING"))
    }

    /// `key` as a bool (BOOL only).
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.wrong_type(key, v, "BOOL"))
    }

    /// `key` as an array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&MetaArray> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong_type(key, v, "ARRAY"))
    }

    /// `key` as an array of strings (ARRAY[STRING]), e.g. `tokenizer.ggml.tokens`.
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(|a| a.as_strings())
            .ok_or_else(|| self.wrong_type(key, v, "ARRAY[STRING]"))
    }

    /// `key` as an array of i32 (ARRAY[INT32]), e.g. `tokenizer.ggml.token_type`.
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32]> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(|a| a.as_i32())
            .ok_or_else(|| self.wrong_type(key, v, "ARRAY[INT32]"))
    }

    /// `key` as an array of f32 (ARRAY[FLOAT32]), e.g. `tokenizer.ggml.scores`.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(|a| a.as_f32())
            .ok_or_else(|| self.wrong_type(key, v, "ARRAY[FLOAT32]"))
    }

    /// Like [`GgufFile::get_u32`], but `Ok(None)` when the key is absent (still an error when
    /// present with the wrong type).
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>> {
        self.get(key)
            .map(|v| self.int(key, v, "UINT32"))
            .transpose()
    }

    /// Like [`GgufFile::get_u64`], `Ok(None)` when absent.
    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| self.int(key, v, "UINT64"))
            .transpose()
    }

    /// Like [`GgufFile::get_f32`], `Ok(None)` when absent.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.get_f32(key).map(Some)
    }

    /// Like [`GgufFile::get_str`], `Ok(None)` when absent.
    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.get_str(key).map(Some)
    }

    /// Like [`GgufFile::get_bool`], `Ok(None)` when absent.
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.get_bool(key).map(Some)
    }

    /// Like [`GgufFile::get_array`], `Ok(None)` when absent.
    pub fn get_array_opt(&self, key: &str) -> Result<Option<&MetaArray>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.get_array(key).map(Some)
    }
}

#[cfg(test)]
mod tests;
