//! The CUDA device as fak uses it: the driver library loaded at run time (cudarc with
//! `dynamic-loading`, driver API only), the device's primary context, one stream, device memory
//! with RAII frees, and pinned host staging memory.
//!
//! Every call first makes the context current on the calling thread ([`Device::bind`]): the
//! engine runs forwards on rayon worker threads and Python calls arrive on others.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;

use crate::{FakError, Result};

/// A driver error as a [`FakError::Backend`], with the call that failed and the driver's words.
pub(crate) fn drv(what: &str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let e = cudarc::driver::result::DriverError(r);
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{r:?}"));
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Err(FakError::Backend { backend: "cuda".into(), msg: format!("{what}: {name} ({text})") })
}

pub(crate) fn backend_err(msg: impl Into<String>) -> FakError {
    FakError::Backend { backend: "cuda".into(), msg: msg.into() }
}

/// Whether the driver library can be loaded at all (no GPU call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library names cudarc knows.
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Runs a driver-library call that may panic inside cudarc when a symbol is missing (an old
/// driver): the panic becomes an error instead of crossing into Python.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Err(backend_err(format!("{what}: the CUDA driver library failed to load ({msg})")))
        }
    }
}

/// One GPU as the driver lists it (for `fak doctor`; no context is created).
#[derive(Debug, Clone)]
pub struct GpuSummary {
    pub ordinal: i32,
    pub name: String,
    /// PCI bus id (`cuDeviceGetPCIBusId`, e.g. `0000:1B:00.0`).
    pub pci_bus_id: String,
    pub cc: (i32, i32),
    pub total_mem: usize,
}

/// How GPU `a` reaches GPU `b` (`cuDeviceCanAccessPeer`, `cuDeviceGetP2PAttribute`).
#[derive(Debug, Clone)]
pub struct PeerLink {
    pub a: i32,
    pub b: i32,
    /// `a` can map `b`'s memory (peer-to-peer over NVLink or PCIe).
    pub access: bool,
    /// The driver's relative performance rank of the link (`CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`).
    pub perf_rank: i32,
    /// Atomics over the link are native (`CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`; NVLink).
    pub native_atomics: bool,
}

/// Every GPU the driver reports and, for each ordered pair, its peer link. Unlike
/// [`Device::open`] this creates no context and accepts any compute capability (it only
/// describes the machine).
///
/// Errors: [`FakError::Backend`] when the driver library is missing or fails.
pub fn list_gpus() -> Result<(Vec<GpuSummary>, Vec<PeerLink>)> {
    if !driver_present() {
        return Err(backend_err("no CUDA driver library (libcuda.so) could be loaded: this machine has no usable NVIDIA driver"));
    }
    guarded("cuInit", || {
        // SAFETY: plain driver queries with valid out-pointers and buffers.
        unsafe {
            drv("cuInit", sys::cuInit(0))?;
            let mut n = 0;
            drv("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n))?;
            let mut gpus = Vec::new();
            let mut devs = Vec::new();
            for ordinal in 0..n {
                let mut dev = 0;
                drv("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
                let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
                    let mut v = 0;
                    drv("cuDeviceGetAttribute", sys::cuDeviceGetAttribute(&mut v, a, dev))?;
                    Ok(v)
                };
                use sys::CUdevice_attribute as A;
                let cc = (attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?);
                let mut buf = [0 as std::ffi::c_char; 256];
                drv("cuDeviceGetName", sys::cuDeviceGetName(buf.as_mut_ptr(), 256, dev))?;
                let name = std::ffi::CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
                let mut bus = [0 as std::ffi::c_char; 64];
                drv("cuDeviceGetPCIBusId", sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 64, dev))?;
                let pci_bus_id = std::ffi::CStr::from_ptr(bus.as_ptr()).to_string_lossy().into_owned();
                let mut total_mem = 0usize;
                drv("cuDeviceTotalMem", sys::cuDeviceTotalMem_v2(&mut total_mem, dev))?;
                gpus.push(GpuSummary { ordinal, name, pci_bus_id, cc, total_mem });
                devs.push(dev);
            }
            let mut links = Vec::new();
            for (a, &da) in devs.iter().enumerate() {
                for (b, &db) in devs.iter().enumerate() {
                    if a == b {
                        continue;
                    }
                    let mut access = 0;
                    drv("cuDeviceCanAccessPeer", sys::cuDeviceCanAccessPeer(&mut access, da, db))?;
                    let p2p = |attr: sys::CUdevice_P2PAttribute| -> Result<i32> {
                        let mut v = 0;
                        drv("cuDeviceGetP2PAttribute", sys::cuDeviceGetP2PAttribute(&mut v, attr, da, db))?;
                        Ok(v)
                    };
                    use sys::CUdevice_P2PAttribute as P;
                    links.push(PeerLink {
                        a: a as i32,
                        b: b as i32,
                        access: access != 0,
                        perf_rank: p2p(P::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
                        native_atomics: p2p(P::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
                    });
                }
            }
            Ok((gpus, links))
        }
    })
}

/// Facts about the device, read once at start-up.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    pub n_sm: i32,
    pub total_mem: usize,
    pub l2_bytes: i32,
    /// The most shared memory one block may opt in to (bytes; 232,448 on Hopper).
    pub max_smem_optin: i32,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
}

impl DeviceInfo {
    /// `90` for compute capability 9.0.
    pub fn sm(&self) -> u32 {
        (self.cc.0 * 10 + self.cc.1) as u32
    }
}

/// The device, its primary context and fak's stream.
pub struct Device {
    pub info: DeviceInfo,
    generation: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    pub(crate) stream: sys::CUstream,
}

// SAFETY: a CUDA context and stream may be used from any thread once made current there
// (`bind`); the handles themselves are plain pointers owned by this struct.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

thread_local! {
    /// (context, generation) last made current on this thread.
    static CURRENT: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// Bumped by every `Device::open`, so that a context handle reused by the driver after a
/// release is never mistaken for one still current on some thread.
static GENERATION: AtomicUsize = AtomicUsize::new(1);

impl Device {
    /// Opens device `ordinal`: loads the driver, retains the primary context, creates a stream.
    ///
    /// Errors: [`FakError::Backend`] with a message saying why no GPU is usable (no driver
    /// library, no device, driver too old).
    pub fn open(ordinal: i32) -> Result<Arc<Device>> {
        if !driver_present() {
            return Err(backend_err("no CUDA driver library (libcuda.so) could be loaded: this machine has no usable NVIDIA driver"));
        }
        guarded("cuInit", || {
            // SAFETY: plain driver calls with valid out-pointers.
            unsafe {
                drv("cuInit", sys::cuInit(0))?;
                let mut n = 0;
                drv("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n))?;
                if n <= ordinal {
                    return Err(backend_err(format!("no CUDA device {ordinal}: the driver reports {n} device(s)")));
                }
                let mut dev = 0;
                drv("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
                let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
                    let mut v = 0;
                    drv("cuDeviceGetAttribute", sys::cuDeviceGetAttribute(&mut v, a, dev))?;
                    Ok(v)
                };
                use sys::CUdevice_attribute as A;
                let cc = (attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?);
                let n_sm = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
                let l2_bytes = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
                let max_smem_optin = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
                let mut name_buf = [0 as std::ffi::c_char; 256];
                drv("cuDeviceGetName", sys::cuDeviceGetName(name_buf.as_mut_ptr(), 256, dev))?;
                let name = std::ffi::CStr::from_ptr(name_buf.as_ptr()).to_string_lossy().into_owned();
                let mut total_mem = 0usize;
                drv("cuDeviceTotalMem", sys::cuDeviceTotalMem_v2(&mut total_mem, dev))?;
                let mut driver_version = 0;
                drv("cuDriverGetVersion", sys::cuDriverGetVersion(&mut driver_version))?;
                if cc.0 < 8 {
                    return Err(backend_err(format!(
                        "{name} has compute capability {}.{}; fak's kernels need 8.0 or newer (Ampere, Ada, Hopper)",
                        cc.0, cc.1
                    )));
                }
                let mut ctx = std::ptr::null_mut();
                drv("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
                drv("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
                let mut stream = std::ptr::null_mut();
                drv("cuStreamCreate", sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32))?;
                let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
                CURRENT.with(|c| c.set((ctx as usize, generation)));
                let info = DeviceInfo { ordinal, name, cc, n_sm, total_mem, l2_bytes, max_smem_optin, driver_version };
                Ok(Arc::new(Device { info, generation, dev, ctx, stream }))
            }
        })
    }

    /// Makes the context current on this thread (a no-op when it already is).
    #[inline]
    pub fn bind(&self) -> Result<()> {
        let want = (self.ctx as usize, self.generation);
        if CURRENT.with(|c| c.get()) != want {
            // SAFETY: the context is retained for the lifetime of `self`.
            drv("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
            CURRENT.with(|c| c.set(want));
        }
        Ok(())
    }

    /// Waits for the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: valid stream.
        drv("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream) })
    }

    /// `(free, total)` device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: valid out-pointers, context current.
        drv("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut f, &mut t) })?;
        Ok((f, t))
    }

    /// `bytes` of device memory (uninitialized; at least 256-byte aligned).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DevMem> {
        self.bind()?;
        let mut ptr = 0;
        if bytes > 0 {
            // SAFETY: valid out-pointer, context current.
            let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) };
            if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                let (free, total) = self.mem_info().unwrap_or((0, 0));
                return Err(backend_err(format!(
                    "out of GPU memory allocating {:.1} MiB ({:.1} of {:.1} MiB free); lower n_ctx, kv_cache_tokens or max_batch",
                    bytes as f64 / 1048576.0,
                    free as f64 / 1048576.0,
                    total as f64 / 1048576.0
                )));
            }
            drv("cuMemAlloc", r)?;
        }
        Ok(DevMem { ptr, bytes, dev: self.clone() })
    }

    /// Device memory holding a copy of `data`.
    pub fn upload<T: Copy>(self: &Arc<Self>, data: &[T]) -> Result<DevMem> {
        let m = self.alloc(std::mem::size_of_val(data))?;
        m.write(0, data)?;
        Ok(m)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: handles created in `open`; errors on teardown are ignored.
        unsafe {
            let _ = sys::cuCtxSetCurrent(self.ctx);
            let _ = sys::cuStreamSynchronize(self.stream);
            let _ = sys::cuStreamDestroy_v2(self.stream);
            let _ = sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
        CURRENT.with(|c| c.set((0, 0)));
    }
}

/// Device memory, freed on drop.
pub struct DevMem {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    pub(crate) dev: Arc<Device>,
}

impl DevMem {
    /// The device address.
    #[inline]
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Host → device copy of `data` at byte offset `offset`, ordered after the work already
    /// queued on fak's stream (a fresh buffer's zero-fill, say) and complete on return.
    pub fn write<T: Copy>(&self, offset: usize, data: &[T]) -> Result<()> {
        let n = std::mem::size_of_val(data);
        if offset + n > self.bytes {
            return Err(backend_err(format!("device write of {n} bytes at {offset} overruns a {}-byte allocation", self.bytes)));
        }
        if n == 0 {
            return Ok(());
        }
        self.dev.bind()?;
        // SAFETY: the range is inside the allocation (checked); `data` is valid for `n` bytes and
        // stays borrowed until the stream is synchronized below.
        unsafe {
            drv("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(self.ptr + offset as u64, data.as_ptr() as *const c_void, n, self.dev.stream))?;
        }
        self.dev.synchronize()
    }

    /// Stream-ordered fill of the whole allocation with `byte`.
    pub fn memset(&self, byte: u8) -> Result<()> {
        self.dev.bind()?;
        // SAFETY: the range is the allocation.
        drv("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(self.ptr, byte, self.bytes, self.dev.stream) })
    }

    /// Stream-ordered device → host copy of `out.len()` elements from byte offset `offset`,
    /// waiting for the stream (so every queued op before it has finished).
    pub fn read<T: Copy>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let n = std::mem::size_of_val(out);
        if offset + n > self.bytes {
            return Err(backend_err(format!("device read of {n} bytes at {offset} overruns a {}-byte allocation", self.bytes)));
        }
        if n == 0 {
            return self.dev.synchronize();
        }
        self.dev.bind()?;
        // SAFETY: the range is inside the allocation; `out` is valid for `n` bytes and the
        // stream is synchronized before returning, so the copy is complete.
        unsafe {
            drv("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, self.ptr + offset as u64, n, self.dev.stream))?;
        }
        self.dev.synchronize()
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.ptr != 0 && self.dev.bind().is_ok() {
            // SAFETY: allocated by cuMemAlloc in `Device::alloc`; pending work that uses it is
            // waited for first (frees of memory a running kernel reads are undefined).
            unsafe {
                let _ = sys::cuStreamSynchronize(self.dev.stream);
                let _ = sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

/// Page-locked host memory (fast, truly asynchronous copies), freed on drop.
pub struct PinnedMem {
    ptr: *mut u8,
    bytes: usize,
    dev: Arc<Device>,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for PinnedMem {}

impl PinnedMem {
    pub fn new(dev: &Arc<Device>, bytes: usize) -> Result<PinnedMem> {
        dev.bind()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer; context current.
        drv("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, bytes.max(1), 0) })?;
        Ok(PinnedMem { ptr: p as *mut u8, bytes: bytes.max(1), dev: dev.clone() })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `bytes` bytes allocated in `new`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// Host `f32` memory for logits read back from the GPU: page-locked (a device-to-host copy runs at
/// the link's speed, several times that of pageable memory), or the heap when `FAK_CUDA_PINNED=0`
/// (for the bench's comparison) or when page-locking fails. Zeroed when made.
pub enum HostF32 {
    Pinned(PinnedMem, usize),
    Heap(Vec<f32>),
}

impl HostF32 {
    /// `n` elements, page-locked unless `FAK_CUDA_PINNED=0` or the driver refuses.
    pub fn new(dev: &Arc<Device>, n: usize) -> Result<HostF32> {
        let pinned = !matches!(std::env::var("FAK_CUDA_PINNED").as_deref(), Ok("0" | "off" | "false" | "no"));
        if pinned {
            if let Ok(mut m) = PinnedMem::new(dev, n * std::mem::size_of::<f32>()) {
                m.as_mut_slice().fill(0);
                return Ok(HostF32::Pinned(m, n));
            }
        }
        crate::backend::cpu::zeroed_vec(n, "the host logits buffer").map(HostF32::Heap)
    }
}

impl std::ops::Deref for HostF32 {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            // SAFETY: ≥ 4·n bytes, page-aligned, initialized (zeroed in `new`), owned by `m`.
            HostF32::Pinned(m, n) => unsafe { std::slice::from_raw_parts(m.as_ptr() as *const f32, *n) },
            HostF32::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for HostF32 {
    fn deref_mut(&mut self) -> &mut [f32] {
        match self {
            HostF32::Pinned(m, n) => {
                let n = *n;
                let bytes = m.as_mut_slice();
                // SAFETY: as in `deref`, and exclusively borrowed through `m`.
                unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f32, n) }
            }
            HostF32::Heap(v) => v,
        }
    }
}

impl Drop for PinnedMem {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc; copies from it are stream-ordered, so wait.
            unsafe {
                let _ = sys::cuStreamSynchronize(self.dev.stream);
                let _ = sys::cuMemFreeHost(self.ptr as *mut c_void);
            }
        }
    }
}
