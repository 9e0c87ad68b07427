//! What a host → device upload overlapped with compute needs: a second stream ([`CopyStream`]),
//! events that order it against fak's compute stream ([`Event`]), and host memory page-locked
//! where it lies ([`HostRegistration`], `cuMemHostRegister`) so that a copy from it is a DMA at
//! the link's speed instead of a staged copy through the driver's bounce buffers.
//!
//! Used by the experts of `--cpu-moe` layers (`ops/moe_host.rs`): for a large batch they are
//! copied to the GPU layer by layer on the copy stream while the compute stream runs the layers
//! before, as llama.cpp does for weights in host memory at batches of 32 rows and more.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;

use super::device::{drv, DevMem, Device};
use crate::Result;

/// A stream of its own for copies (non-blocking with respect to the legacy default stream).
pub struct CopyStream {
    dev: Arc<Device>,
    pub(crate) stream: sys::CUstream,
}

// SAFETY: a stream handle may be used from any thread once its context is current (`bind`).
unsafe impl Send for CopyStream {}
unsafe impl Sync for CopyStream {}

impl CopyStream {
    /// A new non-blocking stream on `dev`'s context.
    ///
    /// Errors: [`crate::FakError::Backend`] when the driver refuses (`cuStreamCreate`).
    pub fn new(dev: &Arc<Device>) -> Result<CopyStream> {
        dev.bind()?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer, context current.
        drv("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) })?;
        Ok(CopyStream { dev: dev.clone(), stream })
    }

    /// Waits for the copies queued so far.
    pub fn synchronize(&self) -> Result<()> {
        self.dev.bind()?;
        // SAFETY: valid stream.
        drv("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream) })
    }

    /// Queues a copy of `len` bytes at `src` to `dst` + `offset` (bytes) on this stream: a DMA from
    /// page-locked host memory, a copy staged by the driver from pageable memory.
    ///
    /// Errors: [`crate::FakError::Backend`] when the range overruns `dst` or the driver refuses.
    ///
    /// # Safety
    /// `src..src + len` must stay valid and unchanged until the copy has run (until an event
    /// recorded after it completes, or [`Self::synchronize`]).
    pub unsafe fn copy_to_device(&self, dst: &DevMem, offset: usize, src: *const u8, len: usize) -> Result<()> {
        if offset + len > dst.len() {
            return Err(super::device::backend_err(format!("upload of {len} bytes at {offset} overruns a {}-byte allocation", dst.len())));
        }
        if len == 0 {
            return Ok(());
        }
        self.dev.bind()?;
        drv("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(dst.ptr() + offset as u64, src as *const c_void, len, self.stream))
    }
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: created in `new`; copies still queued finish first.
            unsafe {
                let _ = sys::cuStreamSynchronize(self.stream);
                let _ = sys::cuStreamDestroy_v2(self.stream);
            }
        }
    }
}

/// A CUDA event (no timing): recorded on one stream, waited for on another.
pub struct Event {
    dev: Arc<Device>,
    ev: sys::CUevent,
}

// SAFETY: an event handle may be used from any thread once its context is current.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// A new event on `dev`'s context, without timing (`CU_EVENT_DISABLE_TIMING`).
    ///
    /// Errors: [`crate::FakError::Backend`] when the driver refuses (`cuEventCreate`).
    pub fn new(dev: &Arc<Device>) -> Result<Event> {
        dev.bind()?;
        let mut ev = std::ptr::null_mut();
        // SAFETY: valid out-pointer, context current.
        drv("cuEventCreate", unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) })?;
        Ok(Event { dev: dev.clone(), ev })
    }

    /// Records the event after the work queued so far on `stream`.
    pub(crate) fn record(&self, stream: sys::CUstream) -> Result<()> {
        self.dev.bind()?;
        // SAFETY: valid event and stream of this context.
        drv("cuEventRecord", unsafe { sys::cuEventRecord(self.ev, stream) })
    }

    /// Makes the work queued on `stream` from now on wait for this event's last record (none
    /// recorded yet: no wait).
    pub(crate) fn wait_on(&self, stream: sys::CUstream) -> Result<()> {
        self.dev.bind()?;
        // SAFETY: valid event and stream of this context.
        drv("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream, self.ev, 0) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: created in `new`; the driver defers the release until recorded work is done.
            unsafe {
                let _ = sys::cuEventDestroy_v2(self.ev);
            }
        }
    }
}

/// Host memory page-locked in place (`cuMemHostRegister`, read-only where the driver supports the
/// flag): the whole pages inside `ptr..ptr + len`, unregistered on drop. The memory itself stays
/// owned by whoever mapped it and must outlive this value.
pub struct HostRegistration {
    dev: Arc<Device>,
    base: usize,
    len: usize,
}

// SAFETY: holds an address and a length only; the driver call on drop is thread-agnostic.
unsafe impl Send for HostRegistration {}
unsafe impl Sync for HostRegistration {}

const PAGE: usize = 4096;

impl HostRegistration {
    /// Registers the whole 4 KiB pages of `ptr..ptr + len` (a range shorter than a page or two
    /// registers nothing: `None`). Pages of two ranges never overlap, so adjacent tensors of one
    /// file map register independently. `Err` when the driver refuses (the caller copies from
    /// pageable memory then).
    pub fn new(dev: &Arc<Device>, ptr: *const u8, len: usize) -> Result<Option<HostRegistration>> {
        let start = (ptr as usize).div_ceil(PAGE) * PAGE;
        let end = (ptr as usize + len) / PAGE * PAGE;
        if end <= start {
            return Ok(None);
        }
        dev.bind()?;
        let p = start as *mut c_void;
        // SAFETY: `start..end` lies inside memory the caller keeps mapped; the driver only pins it.
        let mut r = unsafe { sys::cuMemHostRegister_v2(p, end - start, sys::CU_MEMHOSTREGISTER_READ_ONLY) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: as above; drivers without read-only registration take plain flags.
            r = unsafe { sys::cuMemHostRegister_v2(p, end - start, 0) };
        }
        drv("cuMemHostRegister", r)?;
        Ok(Some(HostRegistration { dev: dev.clone(), base: start, len: end - start }))
    }

    /// The registered range `(offset from ptr, bytes)` of the `ptr` given to [`Self::new`].
    pub fn span(&self, ptr: *const u8) -> (usize, usize) {
        (self.base - ptr as usize, self.len)
    }

    /// Bytes page-locked (whole 4 KiB pages).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: registered in `new`. Copies from it are queued on fak's streams: wait for
            // the device first so that none still reads the pages.
            unsafe {
                let _ = sys::cuCtxSynchronize();
                let _ = sys::cuMemHostUnregister(self.base as *mut c_void);
            }
        }
    }
}
