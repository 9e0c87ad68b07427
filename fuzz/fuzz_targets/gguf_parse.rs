//! Fuzz target: the GGUF header parser on arbitrary bytes. A file that parses is exercised the
//! way a loader would use it (metadata getters, tensor data, dequantization of small tensors);
//! nothing may panic, and every parsed tensor must lie inside the file.
#![no_main]

use fak::gguf::GgufFile;
use fak::quant;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    assert!(f.data_offset() % f.alignment() == 0);
    for (key, value) in f.metadata() {
        let _ = value.type_name();
        let _ = f.get_u32(key);
        let _ = f.get_str_array(key);
    }
    for t in f.tensors() {
        let bytes = f.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes, "tensor {} data out of the file", t.name);
        assert!(t.offset + t.n_bytes <= f.file_size());
        assert_eq!(f.tensor(&t.name), Some(t));
        if t.n_elements <= 1 << 16 {
            let mut out = vec![0f32; t.n_elements as usize];
            let _ = quant::dequantize(t.ggml_type, bytes, &mut out);
        }
    }
});
