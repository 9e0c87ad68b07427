//! The CPU backend: the reference implementation of every op (quantized matmul with run-time
//! chosen SIMD, multi-threaded on the caller's rayon pool).

pub mod matmul;
