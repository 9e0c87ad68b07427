//! Compute backends: the ops of a forward pass on CPU (the reference) and CUDA.

pub mod cpu;
