//! The GGUF header parser: magic, version, counts, metadata key/values, tensor infos, alignment
//! and the data-section offset, read from a byte slice with every length and count checked
//! against the bytes left. Layout from the GGUF spec (ggml `docs/gguf.md`) and the checks of
//! ggml's `gguf.cpp` reader.
//!
//! Error offsets: a field that cannot be read or holds an invalid value is reported at the byte
//! offset where that field starts. Tensor-data problems (misaligned, past the end of the file) are
//! reported at the offset of the tensor info's `offset` field; the message gives the data range.

use std::collections::HashMap;

use super::value::{MetaArray, MetaValue, MetaValueType};
use super::TensorInfo;
use crate::quant::GgmlType;
use crate::{FakError, Result};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data-section alignment when `general.alignment` is absent (GGUF spec).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of metadata arrays accepted (arrays of arrays of ...). Real files nest at most
/// once; the limit keeps a hostile file from exhausting the stack.
pub const MAX_ARRAY_DEPTH: usize = 16;
/// Most entries reserved up front for a counted collection. Counts are checked against the bytes
/// left, but an entry in memory can be several times larger than its smallest encoding, so
/// collections beyond this grow as entries are actually read instead of being reserved.
const MAX_PREALLOC: usize = 1 << 16;
/// Fewest bytes one metadata key/value can take: key length (8) + value type (4) + 1 byte.
const MIN_KV_BYTES: u64 = 13;
/// Fewest bytes one tensor info can take: name length (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;

/// Everything the header says, parsed.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub meta_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(FakError::gguf(
                self.offset(),
                format!(
                    "truncated: {what} needs {n} bytes but the file ends {} bytes later (file size {})",
                    self.remaining(),
                    self.buf.len()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8.
    fn string(&mut self, what: &str) -> Result<String> {
        let len_at = self.offset();
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(FakError::gguf(
                len_at,
                format!(
                    "{what}: string length {len} runs past the end of the file ({} bytes left)",
                    self.remaining()
                ),
            ));
        }
        let at = self.offset();
        let bytes = self.take(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(FakError::gguf(
                at + e.valid_up_to() as u64,
                format!(
                    "{what}: string is not valid UTF-8 (bad byte {} bytes into it)",
                    e.valid_up_to()
                ),
            )),
        }
    }

    fn value_type(&mut self, what: &str) -> Result<MetaValueType> {
        let at = self.offset();
        let id = self.u32(what)?;
        MetaValueType::from_id(id).ok_or_else(|| {
            FakError::gguf(at, format!("{what}: unknown metadata value type id {id}"))
        })
    }

    fn bool(&mut self, what: &str) -> Result<bool> {
        let at = self.offset();
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(FakError::gguf(
                at,
                format!("{what}: BOOL value {b} is neither 0 nor 1"),
            )),
        }
    }

    /// One metadata value of type `t`. `what` names the key for error messages.
    fn value(&mut self, t: MetaValueType, what: &str, depth: usize) -> Result<MetaValue> {
        use MetaValueType as T;
        Ok(match t {
            T::U8 => MetaValue::U8(u8::from_le_bytes(self.array(what)?)),
            T::I8 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            T::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            T::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            T::U32 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            T::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            T::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            T::Bool => MetaValue::Bool(self.bool(what)?),
            T::String => MetaValue::String(self.string(what)?),
            T::Array => MetaValue::Array(self.meta_array(what, depth)?),
            T::U64 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            T::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            T::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    /// A metadata array: u32 element type, u64 count, the elements. The count is checked against
    /// the bytes left before anything is allocated for it.
    fn meta_array(&mut self, what: &str, depth: usize) -> Result<MetaArray> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(FakError::gguf(
                self.offset(),
                format!("{what}: metadata arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
            ));
        }
        let et = self.value_type(what)?;
        let count_at = self.offset();
        let n = self.u64(what)?;
        let left = self.remaining() as u64;
        let need = n.checked_mul(et.min_size() as u64);
        if need.is_none_or(|need| need > left) {
            return Err(FakError::gguf(
                count_at,
                format!(
                    "{what}: array of {n} {} elements runs past the end of the file ({left} bytes left)",
                    et.name()
                ),
            ));
        }
        let n = n as usize; // n * min_size <= bytes left, so n fits in usize
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                const SZ: usize = std::mem::size_of::<$t>();
                let bytes = self.take(n * SZ, what)?;
                MetaArray::$variant(
                    bytes
                        .chunks_exact(SZ)
                        .map(|c| {
                            let mut a = [0u8; SZ];
                            a.copy_from_slice(c);
                            <$t>::from_le_bytes(a)
                        })
                        .collect(),
                )
            }};
        }
        use MetaValueType as T;
        Ok(match et {
            T::U8 => MetaArray::U8(self.take(n, what)?.to_vec()),
            T::I8 => fixed!(I8, i8),
            T::U16 => fixed!(U16, u16),
            T::I16 => fixed!(I16, i16),
            T::U32 => fixed!(U32, u32),
            T::I32 => fixed!(I32, i32),
            T::F32 => fixed!(F32, f32),
            T::U64 => fixed!(U64, u64),
            T::I64 => fixed!(I64, i64),
            T::F64 => fixed!(F64, f64),
            T::Bool => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    v.push(self.bool(what)?);
                }
                MetaArray::Bool(v)
            }
            T::String => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    v.push(self.string(what)?);
                }
                MetaArray::String(v)
            }
            T::Array => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    v.push(self.meta_array(what, depth + 1)?);
                }
                MetaArray::Array(v)
            }
        })
    }
}

/// Checks a count read at `at` against the bytes left: each item takes at least `min_bytes`.
fn check_count(n: u64, min_bytes: u64, left: usize, at: u64, what: &str) -> Result<()> {
    match n.checked_mul(min_bytes) {
        Some(need) if need <= left as u64 => Ok(()),
        _ => Err(FakError::gguf(
            at,
            format!(
                "{what} {n} is impossible: {n} entries need at least {min_bytes} bytes each but only {left} bytes are left"
            ),
        )),
    }
}

/// Parses the header of the GGUF file `buf` (the whole file: tensor data ranges are checked
/// against its length).
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    if buf.len() < 4 {
        return Err(FakError::gguf(
            0,
            format!(
                "truncated: the file is {} bytes, too short for the GGUF magic",
                buf.len()
            ),
        ));
    }
    let magic: [u8; 4] = c.array("magic")?;
    if magic != GGUF_MAGIC {
        return Err(FakError::gguf(
            0,
            format!(
                "wrong magic {magic:02x?} (expected \"GGUF\" = [47, 47, 55, 46]): not a GGUF file"
            ),
        ));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(FakError::gguf(
                4,
                "unsupported GGUF version 1 (fak reads v2 and v3); re-convert the model with a current llama.cpp",
            ))
        }
        v if v & 0xffff == 0 && matches!(v.swap_bytes(), 2 | 3) => {
            return Err(FakError::gguf(
                4,
                format!("big-endian GGUF (version {} byte-swapped) is not supported", v.swap_bytes()),
            ))
        }
        v => return Err(FakError::gguf(4, format!("unsupported GGUF version {v} (fak reads v2 and v3)"))),
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata key/value count")?;
    check_count(
        n_kv,
        MIN_KV_BYTES,
        c.remaining(),
        16,
        "metadata key/value count",
    )?;
    check_count(
        n_tensors,
        MIN_TENSOR_INFO_BYTES,
        c.remaining(),
        8,
        "tensor count",
    )?;

    let mut metadata: Vec<(String, MetaValue)> =
        Vec::with_capacity((n_kv as usize).min(MAX_PREALLOC));
    let mut meta_index: HashMap<String, usize> =
        HashMap::with_capacity((n_kv as usize).min(MAX_PREALLOC));
    let mut alignment_at = None;
    for i in 0..n_kv {
        let kv_at = c.offset();
        let key = c.string(&format!("metadata key #{i}"))?;
        if meta_index.contains_key(&key) {
            return Err(FakError::gguf(
                kv_at,
                format!("duplicate metadata key `{key}`"),
            ));
        }
        let what = format!("metadata `{key}`");
        let t = c.value_type(&what)?;
        let value_at = c.offset();
        let value = c.value(t, &what, 0)?;
        if key == "general.alignment" {
            alignment_at = Some(value_at);
        }
        meta_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    check_count(
        n_tensors,
        MIN_TENSOR_INFO_BYTES,
        c.remaining(),
        8,
        "tensor count",
    )?;
    struct RawInfo {
        name: String,
        dims: Vec<u64>,
        ggml_type: GgmlType,
        rel_offset: u64,
        offset_at: u64,
        n_elements: u64,
        n_bytes: u64,
    }
    let mut raw: Vec<RawInfo> = Vec::with_capacity((n_tensors as usize).min(MAX_PREALLOC));
    let mut tensor_index: HashMap<String, usize> =
        HashMap::with_capacity((n_tensors as usize).min(MAX_PREALLOC));
    for i in 0..n_tensors {
        let info_at = c.offset();
        let name = c.string(&format!("tensor #{i} name"))?;
        if tensor_index.contains_key(&name) {
            return Err(FakError::gguf(
                info_at,
                format!("duplicate tensor name `{name}`"),
            ));
        }
        let what = format!("tensor `{name}`");
        let n_dims_at = c.offset();
        let n_dims = c.u32(&what)?;
        if n_dims as usize > MAX_DIMS {
            return Err(FakError::gguf(
                n_dims_at,
                format!("{what}: {n_dims} dimensions, more than ggml's maximum of {MAX_DIMS}"),
            ));
        }
        let dims_at = c.offset();
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let at = c.offset();
            let d = c.u64(&what)?;
            if d > i64::MAX as u64 {
                return Err(FakError::gguf(
                    at,
                    format!("{what}: dimension {d} exceeds 2^63-1"),
                ));
            }
            dims.push(d);
        }
        let type_at = c.offset();
        let type_id = c.u32(&what)?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            FakError::gguf(
                type_at,
                format!("{what}: unknown ggml tensor type id {type_id}"),
            )
        })?;
        let offset_at = c.offset();
        let rel_offset = c.u64(&what)?;

        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                FakError::gguf(
                    dims_at,
                    format!("{what}: dimensions {dims:?} overflow (element count exceeds 2^63-1)"),
                )
            })?;
        let (bs, ts) = ggml_type.block_geometry();
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % bs as u64 != 0 {
            return Err(FakError::gguf(
                dims_at,
                format!(
                    "{what}: row of {ne0} elements is not a whole number of {} blocks ({bs} elements each)",
                    ggml_type.name()
                ),
            ));
        }
        let n_bytes = (n_elements / bs as u64)
            .checked_mul(ts as u64)
            .ok_or_else(|| {
                FakError::gguf(
                    dims_at,
                    format!("{what}: dimensions {dims:?} overflow (byte size exceeds 2^64-1)"),
                )
            })?;
        tensor_index.insert(name.clone(), raw.len());
        raw.push(RawInfo {
            name,
            dims,
            ggml_type,
            rel_offset,
            offset_at,
            n_elements,
            n_bytes,
        });
    }
    let header_end = c.offset();

    let alignment = match (meta_index.get("general.alignment"), alignment_at) {
        (Some(&i), Some(at)) => match metadata[i].1 {
            MetaValue::U32(a) if a != 0 && a.is_power_of_two() => a as u64,
            MetaValue::U32(a) => {
                return Err(FakError::gguf(
                    at,
                    format!("general.alignment {a} is not a non-zero power of two"),
                ))
            }
            ref v => {
                return Err(FakError::gguf(
                    at,
                    format!(
                        "general.alignment has type {}, the spec requires UINT32",
                        v.type_name()
                    ),
                ))
            }
        },
        _ => DEFAULT_ALIGNMENT,
    };
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_size = buf.len() as u64;

    let mut tensors = Vec::with_capacity(raw.len());
    for r in raw {
        let what = format!("tensor `{}`", r.name);
        if r.rel_offset % alignment != 0 {
            return Err(FakError::gguf(
                r.offset_at,
                format!(
                    "{what}: data offset {} is not a multiple of the alignment {alignment}",
                    r.rel_offset
                ),
            ));
        }
        let start = data_offset.checked_add(r.rel_offset);
        let end = start.and_then(|s| s.checked_add(r.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_size => tensors.push(TensorInfo {
                name: r.name,
                dims: r.dims,
                ggml_type: r.ggml_type,
                offset: start,
                n_bytes: r.n_bytes,
                n_elements: r.n_elements,
            }),
            _ => {
                return Err(FakError::gguf(
                    r.offset_at,
                    format!(
                        "{what}: data at file bytes [{data_offset} + {}, +{} bytes) runs past the end of the file ({file_size} bytes); the file is truncated or the tensor info is corrupt",
                        r.rel_offset, r.n_bytes
                    ),
                ))
            }
        }
    }
    Ok(Header {
        version,
        metadata,
        meta_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}
