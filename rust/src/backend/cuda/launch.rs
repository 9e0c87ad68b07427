//! Kernel launch: packs scalar and pointer arguments into 8-byte slots (the driver reads each
//! parameter through its pointer with the size the kernel declares, so the low bytes of a slot
//! hold a 4-byte value) and calls `cuLaunchKernel` on fak's stream.
//!
//! Programmatic dependent launch (Hopper and later; [`pdl_mode`]): in decode steps of up to
//! [`PDL_MAX_ROWS`] rows, every launch of an image compiled for sm_90+ (except the families of
//! `module::PDL_SKIP_DEFAULT`, the int8 GEMMs) goes through `cuLaunchKernelEx` with programmatic
//! stream serialization, so the GPU may start a kernel while the one before it in the stream
//! still runs. Every kernel calls `pdl_enter()` (`rust/kernels/common.cuh`:
//! `griddepcontrol.wait`, then `griddepcontrol.launch_dependents`) before it touches memory
//! another kernel writes, so results are those of plain stream order; what overlaps is the
//! launch, the block start-up and the GEMVs' prefetch of their weights into L2. Stream capture
//! records the launches as programmatic edges, so the decode graphs keep the overlap.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::device::drv;
use super::CudaBackend;
use crate::Result;

/// Decode steps of up to this many rows launch with programmatic stream serialization. There the
/// step is a chain of ~316 short kernels and the overlap gained 14–18% single-stream (1.5B twin,
/// H100, run h5: 645 → 763 tok/s at ctx 0, 587 → 671 at 8k) and 3% at 16 rows; at 64 and 128
/// rows, where the GEMMs dominate, it measured 1–4% slower (h4), and prefill the same within
/// noise (benches/results/cuda.md).
pub const PDL_MAX_ROWS: usize = 16;

/// When launches use programmatic stream serialization (on a GPU of sm_90 or later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdl {
    /// Never (`FAK_CUDA_PDL=0`/`off`, or a GPU before sm_90).
    Off,
    /// In decode steps of at most [`PDL_MAX_ROWS`] rows (the default).
    SmallDecode,
    /// Every launch of the families not skipped (`FAK_CUDA_PDL=all`; with `FAK_CUDA_PDL_SKIP=`
    /// the int8 GEMMs too): a run of the CUDA tests in this mode exercises the kernels' waits
    /// outside decode steps (runs h2, h4, h5). A missing wait is a race, so a pass does not
    /// prove every kernel has one; `rust/kernels` is read for that.
    All,
}

/// The launch mode on a GPU of compute capability `sm` (e.g. 90) under a driver of
/// `driver_version` (`cuDriverGetVersion`), from `FAK_CUDA_PDL`. Off before sm_90 and before
/// CUDA 12.3 (`cuLaunchKernelEx` came with 12.0, programmatic edges in stream capture with 12.3).
pub fn pdl_mode(sm: u32, driver_version: i32) -> Pdl {
    if sm < 90 || driver_version < 12030 {
        return Pdl::Off;
    }
    match std::env::var("FAK_CUDA_PDL").as_deref().map(str::to_ascii_lowercase).as_deref() {
        Ok("0" | "off" | "false" | "no") => Pdl::Off,
        Ok("all") => Pdl::All,
        _ => Pdl::SmallDecode,
    }
}

/// Kernel arguments in declaration order.
#[derive(Default)]
pub struct Args {
    slots: [u64; 32],
    n: usize,
}

impl Args {
    pub fn new() -> Args {
        Args::default()
    }
    fn push(mut self, v: u64) -> Args {
        assert!(self.n < self.slots.len(), "too many kernel arguments");
        self.slots[self.n] = v;
        self.n += 1;
        self
    }
    /// A device pointer (or 0 for a null pointer).
    pub fn ptr(self, p: u64) -> Args {
        self.push(p)
    }
    pub fn i32(self, v: i32) -> Args {
        self.push(v as u32 as u64)
    }
    pub fn u64(self, v: u64) -> Args {
        self.push(v)
    }
    pub fn f32(self, v: f32) -> Args {
        self.push(v.to_bits() as u64)
    }
}

impl CudaBackend {
    /// Launches `family::name` with `grid` × `block` threads and `smem` bytes of dynamic shared
    /// memory.
    pub(crate) fn launch(&self, family: &'static str, name: &'static str, grid: (u32, u32, u32), block: u32, smem: u32, args: Args) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        self.dev.bind()?;
        let (f, image_pdl) = self.kernels.func(family, name, smem as usize)?;
        let mut slots = args.slots;
        let mut ptrs: [*mut c_void; 32] = [std::ptr::null_mut(); 32];
        for (p, s) in ptrs.iter_mut().zip(slots.iter_mut()).take(args.n) {
            *p = s as *mut u64 as *mut c_void;
        }
        if image_pdl && self.pdl_now.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: a zeroed attribute is valid plain data; the id and its union member are set.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.dev.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; `cfg` and `attr` outlive the call, and the kernel's image waits
            // for the kernel before it (`pdl_enter`) before touching global memory other kernels
            // use.
            return drv(name, unsafe { sys::cuLaunchKernelEx(&cfg, f, ptrs.as_mut_ptr(), std::ptr::null_mut()) });
        }
        // SAFETY: `f` is a loaded kernel whose parameters match `args` (each call site passes the
        // kernel's signature in order); pointers are device allocations owned by live buffers.
        drv(name, unsafe { sys::cuLaunchKernel(f, grid.0, grid.1, grid.2, block, 1, 1, smem, self.dev.stream, ptrs.as_mut_ptr(), std::ptr::null_mut()) })
    }
}
