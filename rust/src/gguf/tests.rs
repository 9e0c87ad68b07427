//! Unit tests of the GGUF reader on files built in memory: every value type, nested arrays,
//! alignment, and one test per class of malformed input (each checks the reported offset).
//! To add a case: build the bytes with [`Builder`], corrupt them, assert the error.

use super::*;

/// Writes a GGUF file in memory (little-endian, as the spec lays it out).
struct Builder {
    version: u32,
    kv: Vec<(String, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    alignment: u64,
    data: Vec<u8>,
}

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(x.as_bytes());
    v
}

impl Builder {
    fn new() -> Self {
        Builder {
            version: 3,
            kv: vec![],
            tensors: vec![],
            alignment: 32,
            data: vec![],
        }
    }
    /// Adds a key with its raw (type id + value) encoding.
    fn kv_raw(mut self, key: &str, type_and_value: Vec<u8>) -> Self {
        self.kv.push((key.to_string(), type_and_value));
        self
    }
    fn kv_u32(self, key: &str, v: u32) -> Self {
        let mut b = 4u32.to_le_bytes().to_vec();
        b.extend_from_slice(&v.to_le_bytes());
        self.kv_raw(key, b)
    }
    fn kv_str(self, key: &str, v: &str) -> Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend(s(v));
        self.kv_raw(key, b)
    }
    /// Adds an F32 tensor with `dims` filled with 0, 1, 2, ...; its data is placed aligned.
    fn tensor_f32(mut self, name: &str, dims: &[u64]) -> Self {
        let n: u64 = dims.iter().product();
        while self.data.len() as u64 % self.alignment != 0 {
            self.data.push(0);
        }
        let off = self.data.len() as u64;
        for i in 0..n {
            self.data.extend_from_slice(&(i as f32).to_le_bytes());
        }
        self.tensors.push((name.to_string(), dims.to_vec(), 0, off));
        self
    }
    fn tensor_raw(mut self, name: &str, dims: &[u64], ty: u32, off: u64) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, off));
        self
    }
    /// The file bytes, plus the offset where the tensor infos start.
    fn build(&self) -> (Vec<u8>, usize) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            b.extend(s(k));
            b.extend_from_slice(v);
        }
        let infos_at = b.len();
        for (name, dims, ty, off) in &self.tensors {
            b.extend(s(name));
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
        while b.len() as u64 % self.alignment != 0 {
            b.push(0);
        }
        b.extend_from_slice(&self.data);
        (b, infos_at)
    }
    fn bytes(&self) -> Vec<u8> {
        self.build().0
    }
}

fn err_of(bytes: Vec<u8>) -> (String, u64) {
    match GgufFile::from_bytes(bytes) {
        Err(FakError::Gguf { msg, offset }) => (msg, offset),
        Err(e) => panic!("expected a GGUF error, got {e}"),
        Ok(_) => panic!("expected a GGUF error, the file parsed"),
    }
}

fn all_types_builder() -> Builder {
    let mut arr_of_arr = 9u32.to_le_bytes().to_vec(); // ARRAY
    arr_of_arr.extend_from_slice(&9u32.to_le_bytes()); // of ARRAY
    arr_of_arr.extend_from_slice(&2u64.to_le_bytes());
    arr_of_arr.extend_from_slice(&4u32.to_le_bytes()); // [0]: ARRAY[UINT32] of 2
    arr_of_arr.extend_from_slice(&2u64.to_le_bytes());
    arr_of_arr.extend_from_slice(&7u32.to_le_bytes());
    arr_of_arr.extend_from_slice(&8u32.to_le_bytes());
    arr_of_arr.extend_from_slice(&8u32.to_le_bytes()); // [1]: ARRAY[STRING] of 1
    arr_of_arr.extend_from_slice(&1u64.to_le_bytes());
    arr_of_arr.extend(s("héllo"));
    let mut tokens = 9u32.to_le_bytes().to_vec();
    tokens.extend_from_slice(&8u32.to_le_bytes());
    tokens.extend_from_slice(&3u64.to_le_bytes());
    for t in ["a", "", "ccc"] {
        tokens.extend(s(t));
    }
    let mut types = 9u32.to_le_bytes().to_vec();
    types.extend_from_slice(&5u32.to_le_bytes());
    types.extend_from_slice(&2u64.to_le_bytes());
    types.extend_from_slice(&(-1i32).to_le_bytes());
    types.extend_from_slice(&3i32.to_le_bytes());
    let scalar = |id: u32, v: &[u8]| {
        let mut b = id.to_le_bytes().to_vec();
        b.extend_from_slice(v);
        b
    };
    Builder::new()
        .kv_str("general.architecture", "qwen2")
        .kv_raw("u8", scalar(0, &[200]))
        .kv_raw("i8", scalar(1, &[0xff]))
        .kv_raw("u16", scalar(2, &60000u16.to_le_bytes()))
        .kv_raw("i16", scalar(3, &(-3i16).to_le_bytes()))
        .kv_u32("u32", 4_000_000_000)
        .kv_raw("i32", scalar(5, &(-5i32).to_le_bytes()))
        .kv_raw("f32", scalar(6, &1.5f32.to_le_bytes()))
        .kv_raw("bool", scalar(7, &[1]))
        .kv_raw("u64", scalar(10, &u64::MAX.to_le_bytes()))
        .kv_raw("i64", scalar(11, &i64::MIN.to_le_bytes()))
        .kv_raw("f64", scalar(12, &0.25f64.to_le_bytes()))
        .kv_raw("nested", arr_of_arr)
        .kv_raw("tokenizer.ggml.tokens", tokens)
        .kv_raw("tokenizer.ggml.token_type", types)
        .tensor_f32("a", &[4, 3])
        .tensor_f32("b", &[5])
}

#[test]
fn parses_every_value_type_and_tensor() {
    let f = GgufFile::from_bytes(all_types_builder().bytes()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata().len(), 15);
    assert_eq!(f.metadata()[0].0, "general.architecture");
    assert_eq!(f.get_str("general.architecture").unwrap(), "qwen2");
    assert_eq!(f.get("u8"), Some(&MetaValue::U8(200)));
    assert_eq!(f.get("i8"), Some(&MetaValue::I8(-1)));
    assert_eq!(f.get("u16"), Some(&MetaValue::U16(60000)));
    assert_eq!(f.get("i16"), Some(&MetaValue::I16(-3)));
    assert_eq!(f.get_u32("u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get("i32"), Some(&MetaValue::I32(-5)));
    assert_eq!(f.get_f32("f32").unwrap(), 1.5);
    assert!(f.get_bool("bool").unwrap());
    assert_eq!(f.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(f.get_i64("i64").unwrap(), i64::MIN);
    assert_eq!(f.get("f64"), Some(&MetaValue::F64(0.25)));
    assert_eq!(f.get_u32("u8").unwrap(), 200);
    let nested = f.get_array("nested").unwrap();
    assert_eq!(
        nested,
        &MetaArray::Array(vec![
            MetaArray::U32(vec![7, 8]),
            MetaArray::String(vec!["héllo".into()])
        ])
    );
    assert_eq!(f.get("nested").unwrap().type_name(), "ARRAY[ARRAY[UINT32]]");
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap(),
        &["a", "", "ccc"]
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        &[-1, 3]
    );

    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    let a = f.tensor("a").unwrap();
    assert_eq!(a.dims, vec![4, 3]);
    assert_eq!(a.n_elements, 12);
    assert_eq!(a.n_bytes, 48);
    assert_eq!(a.offset, f.data_offset());
    assert_eq!((a.row_len(), a.n_rows(), a.row_bytes()), (4, 3, 16));
    assert_eq!(a.shape_row_major(), vec![3, 4]);
    let b = f.tensor("b").unwrap();
    assert_eq!(b.offset, f.data_offset() + 64);
    assert_eq!(f.dequantize(b).unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0]);
    assert_eq!(f.tensor_data(a).len(), 48);
    assert_eq!(&f.tensor_data(a)[4..8], &1f32.to_le_bytes());
    assert!(f.tensor("c").is_none());
    assert_eq!(
        f.tensors()
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

#[test]
fn typed_getters_report_missing_and_wrong_types() {
    let f = GgufFile::from_bytes(all_types_builder().bytes()).unwrap();
    let e = f.get_u32("nope").unwrap_err().to_string();
    assert!(e.contains("`nope` is missing"), "{e}");
    let e = f.get_u32("general.architecture").unwrap_err().to_string();
    assert!(e.contains("has type STRING, expected UINT32"), "{e}");
    let e = f.get_u32("i32").unwrap_err().to_string();
    assert!(e.contains("-5 does not fit"), "{e}");
    assert!(matches!(
        f.get_str_array("tokenizer.ggml.token_type"),
        Err(FakError::Model(_))
    ));
    assert_eq!(f.get_u32_opt("nope").unwrap(), None);
    assert_eq!(f.get_u32_opt("u16").unwrap(), Some(60000));
    assert!(f.get_u32_opt("general.architecture").is_err());
    assert_eq!(
        f.get_str_opt("general.architecture").unwrap(),
        Some("qwen2")
    );
    assert_eq!(f.get_bool_opt("nope").unwrap(), None);
    assert_eq!(f.get_f32_opt("f64").unwrap(), Some(0.25));
    assert!(f.get_array_opt("u8").is_err());
}

#[test]
fn version_2_and_custom_alignment() {
    let mut b = Builder::new();
    b.version = 2;
    b.alignment = 64;
    let b = b
        .kv_u32("general.alignment", 64)
        .tensor_f32("x", &[3])
        .tensor_f32("y", &[2, 2]);
    let f = GgufFile::from_bytes(b.bytes()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("y").unwrap().offset, f.data_offset() + 64);
}

#[test]
fn empty_file_and_header_only() {
    let b = Builder::new();
    let f = GgufFile::from_bytes(b.bytes()).unwrap();
    assert_eq!(f.tensors().len(), 0);
    assert_eq!(f.data_offset(), 32);
    // 24 bytes, no padding: still valid (no tensor needs the data section)
    let mut bytes = b.bytes();
    bytes.truncate(24);
    assert!(GgufFile::from_bytes(bytes).is_ok());
}

#[test]
fn wrong_magic() {
    let mut bytes = all_types_builder().bytes();
    bytes[0] = b'X';
    let (msg, off) = err_of(bytes);
    assert_eq!(off, 0);
    assert!(msg.contains("wrong magic"), "{msg}");
    let (msg, off) = err_of(b"GG".to_vec());
    assert_eq!(off, 0);
    assert!(msg.contains("too short"), "{msg}");
}

#[test]
fn unsupported_versions() {
    for (v, want) in [
        (1u32, "version 1"),
        (4, "version 4"),
        (0x0300_0000, "big-endian"),
    ] {
        let mut b = all_types_builder();
        b.version = v;
        let (msg, off) = err_of(b.bytes());
        assert_eq!(off, 4);
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn truncated_header_at_every_length() {
    let (bytes, _) = all_types_builder().build();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let header_end = f.tensors().iter().map(|t| t.offset).min().unwrap() as usize;
    for n in 0..header_end {
        let r = GgufFile::from_bytes(bytes[..n].to_vec());
        match r {
            Err(FakError::Gguf { offset, .. }) => {
                assert!(offset <= n as u64, "len {n}: offset {offset}")
            }
            Err(e) => panic!("len {n}: {e}"),
            // cutting only padding leaves a valid header whose tensors now run past the end: error
            Ok(_) => panic!("len {n}: truncated file parsed"),
        }
    }
}

#[test]
fn truncated_data() {
    let mut bytes = all_types_builder().bytes();
    bytes.truncate(bytes.len() - 1);
    let (msg, _) = err_of(bytes);
    assert!(
        msg.contains("tensor `b`") && msg.contains("runs past the end of the file"),
        "{msg}"
    );
}

#[test]
fn tensor_data_past_end_reports_offset_field() {
    let b = Builder::new().tensor_raw("t", &[8], 0, 1 << 40);
    let (bytes, infos_at) = b.build();
    let (msg, off) = err_of(bytes);
    // name (8 + 1) + n_dims (4) + dims (8) + type (4) -> offset field
    assert_eq!(off as usize, infos_at + 9 + 4 + 8 + 4);
    assert!(msg.contains("runs past the end"), "{msg}");
    // offset + size overflowing u64
    let (msg, _) = err_of(
        Builder::new()
            .tensor_raw("t", &[8], 0, u64::MAX - 31)
            .bytes(),
    );
    assert!(msg.contains("runs past the end"), "{msg}");
}

#[test]
fn misaligned_tensor_offset() {
    let b = Builder::new().tensor_raw("t", &[1], 0, 4);
    let (mut bytes, infos_at) = b.build();
    bytes.extend_from_slice(&[0u8; 64]);
    let (msg, off) = err_of(bytes);
    assert_eq!(off as usize, infos_at + 9 + 4 + 8 + 4);
    assert!(msg.contains("not a multiple of the alignment 32"), "{msg}");
}

#[test]
fn unknown_tensor_type() {
    let (bytes, infos_at) = Builder::new().tensor_raw("t", &[32], 4, 0).build();
    let (msg, off) = err_of(bytes);
    assert_eq!(off as usize, infos_at + 9 + 4 + 8);
    assert!(msg.contains("unknown ggml tensor type id 4"), "{msg}");
}

#[test]
fn dimension_checks() {
    let (bytes, infos_at) = Builder::new()
        .tensor_raw("t", &[1, 1, 1, 1, 1], 0, 0)
        .build();
    let (msg, off) = err_of(bytes);
    assert_eq!(off as usize, infos_at + 9);
    assert!(msg.contains("5 dimensions"), "{msg}");

    let (bytes, infos_at) = Builder::new()
        .tensor_raw("t", &[1 << 32, 1 << 32], 0, 0)
        .build();
    let (msg, off) = err_of(bytes);
    assert_eq!(off as usize, infos_at + 9 + 4);
    assert!(msg.contains("overflow"), "{msg}");

    let (bytes, infos_at) = Builder::new().tensor_raw("t", &[u64::MAX], 0, 0).build();
    let (msg, off) = err_of(bytes);
    assert_eq!(off as usize, infos_at + 9 + 4);
    assert!(msg.contains("exceeds 2^63-1"), "{msg}");

    // Q4_K rows must be whole 256-element blocks
    let (bytes, infos_at) = Builder::new().tensor_raw("t", &[100, 2], 12, 0).build();
    let (msg, off) = err_of(bytes);
    assert_eq!(off as usize, infos_at + 9 + 4);
    assert!(msg.contains("not a whole number of Q4_K blocks"), "{msg}");
}

#[test]
fn string_and_array_lengths_past_end() {
    // key length absurd
    let mut bytes = Builder::new().kv_u32("k", 1).bytes();
    bytes[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let (msg, off) = err_of(bytes);
    assert_eq!(off, 24);
    assert!(
        msg.contains("string length 1152921504606846976 runs past the end"),
        "{msg}"
    );

    // string value length absurd: key "k" (8+1), type (4) -> length at 24 + 13
    let mut bytes = Builder::new().kv_str("k", "abc").bytes();
    bytes[37..45].copy_from_slice(&1000u64.to_le_bytes());
    let (msg, off) = err_of(bytes);
    assert_eq!(off, 37);
    assert!(msg.contains("metadata `k`"), "{msg}");

    // array count absurd: type(4) elem type(4) count at 24 + 9 + 8
    let mut arr = 9u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&5u32.to_le_bytes());
    arr.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    let (msg, off) = err_of(Builder::new().kv_raw("k", arr).bytes());
    assert_eq!(off, 41);
    assert!(
        msg.contains("array of 9223372036854775807 INT32 elements runs past the end"),
        "{msg}"
    );

    // invalid UTF-8 in a string
    let mut bytes = Builder::new().kv_str("k", "abc").bytes();
    bytes[46] = 0xff;
    let (msg, off) = err_of(bytes);
    assert_eq!(off, 46);
    assert!(msg.contains("not valid UTF-8"), "{msg}");
}

#[test]
fn absurd_counts() {
    let mut bytes = Builder::new().bytes();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let (msg, off) = err_of(bytes);
    assert_eq!(off, 16);
    assert!(msg.contains("metadata key/value count"), "{msg}");
    let mut bytes = Builder::new().bytes();
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let (msg, off) = err_of(bytes);
    assert_eq!(off, 8);
    assert!(msg.contains("tensor count"), "{msg}");
}

#[test]
fn duplicates_and_bad_values() {
    let (bytes, infos_at) = Builder::new()
        .tensor_f32("t", &[2])
        .tensor_f32("t", &[2])
        .build();
    let (msg, off) = err_of(bytes);
    assert_eq!(off as usize, infos_at + 9 + 4 + 8 + 4 + 8);
    assert!(msg.contains("duplicate tensor name `t`"), "{msg}");

    let (msg, off) = err_of(Builder::new().kv_u32("k", 1).kv_u32("k", 2).bytes());
    assert_eq!(off, 24 + 9 + 4 + 4);
    assert!(msg.contains("duplicate metadata key `k`"), "{msg}");

    let (msg, off) = err_of(Builder::new().kv_raw("k", vec![13, 0, 0, 0, 0]).bytes());
    assert_eq!(off, 33);
    assert!(msg.contains("unknown metadata value type id 13"), "{msg}");

    let (msg, off) = err_of(Builder::new().kv_raw("k", vec![7, 0, 0, 0, 2]).bytes());
    assert_eq!(off, 37);
    assert!(msg.contains("BOOL value 2"), "{msg}");
}

#[test]
fn bad_alignment_values() {
    for (v, want) in [
        (0u32, "not a non-zero power of two"),
        (48, "not a non-zero power of two"),
    ] {
        let (msg, off) = err_of(Builder::new().kv_u32("general.alignment", v).bytes());
        // key "general.alignment" (8 + 17) + type (4) -> value at 24 + 29
        assert_eq!(off, 53);
        assert!(msg.contains(want), "{msg}");
    }
    let (msg, off) = err_of(Builder::new().kv_str("general.alignment", "32").bytes());
    assert_eq!(off, 53);
    assert!(
        msg.contains("has type STRING, the spec requires UINT32"),
        "{msg}"
    );
}

#[test]
fn deep_nesting_is_rejected_not_a_stack_overflow() {
    let mut v = 9u32.to_le_bytes().to_vec();
    for _ in 0..1000 {
        v.extend_from_slice(&9u32.to_le_bytes());
        v.extend_from_slice(&1u64.to_le_bytes());
    }
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    let (msg, _) = err_of(Builder::new().kv_raw("k", v).bytes());
    assert!(msg.contains("nested deeper"), "{msg}");
}

/// Mutates a valid file many times (flip, overwrite with extreme values, insert, delete,
/// truncate); every result must be Ok or a GGUF error, never a panic.
#[test]
fn mutations_never_panic() {
    let base = all_types_builder().bytes();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut n_ok = 0;
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % b.len().max(1);
            match next() % 5 {
                0 => b[at] ^= 1 << (next() % 8),
                1 => b[at] = [0x00, 0xff, 0x7f, 0x80][(next() % 4) as usize],
                2 => b.insert(at, next() as u8),
                3 => {
                    b.remove(at);
                }
                _ => b.truncate(at),
            }
            if b.is_empty() {
                break;
            }
        }
        match GgufFile::from_bytes(b) {
            Ok(_) => n_ok += 1,
            Err(FakError::Gguf { .. }) => {}
            Err(e) => panic!("non-GGUF error {e}"),
        }
    }
    assert!(
        n_ok > 0,
        "some mutations (e.g. inside string values) must stay valid"
    );
}

#[test]
fn gguf_file_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
}

#[test]
fn open_maps_a_file_and_reports_io_errors() {
    let dir = std::env::temp_dir().join(format!("fak-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.gguf");
    std::fs::write(&p, all_types_builder().bytes()).unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.path(), Some(p.as_path()));
    assert_eq!(f.file_size(), std::fs::metadata(&p).unwrap().len());
    assert_eq!(f.dequantize(f.tensor("a").unwrap()).unwrap()[11], 11.0);
    let e = f.get_u32("nope").unwrap_err().to_string();
    assert!(e.contains("t.gguf"), "{e}");
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(FakError::Gguf { offset: 0, .. })
    ));
    assert!(matches!(
        GgufFile::open(dir.join("missing.gguf")),
        Err(FakError::Io(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
