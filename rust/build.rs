//! Build script. CUDA kernel compilation (FAK_CUDA_ARCH) is added by the CUDA backend.
fn main() {
    println!("cargo:rerun-if-changed=rust/build.rs");
}
