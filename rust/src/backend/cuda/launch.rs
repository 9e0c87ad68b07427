//! Kernel launch: packs scalar and pointer arguments into 8-byte slots (the driver reads each
//! parameter through its pointer with the size the kernel declares, so the low bytes of a slot
//! hold a 4-byte value) and calls `cuLaunchKernel` on fak's stream.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::device::drv;
use super::CudaBackend;
use crate::Result;

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
        let f = self.kernels.func(family, name, smem as usize)?;
        let mut slots = args.slots;
        let mut ptrs: [*mut c_void; 32] = [std::ptr::null_mut(); 32];
        for (p, s) in ptrs.iter_mut().zip(slots.iter_mut()).take(args.n) {
            *p = s as *mut u64 as *mut c_void;
        }
        // SAFETY: `f` is a loaded kernel whose parameters match `args` (each call site passes the
        // kernel's signature in order); pointers are device allocations owned by live buffers.
        drv(name, unsafe { sys::cuLaunchKernel(f, grid.0, grid.1, grid.2, block, 1, 1, smem, self.dev.stream, ptrs.as_mut_ptr(), std::ptr::null_mut()) })
    }
}
