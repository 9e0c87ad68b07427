//! The kernel image store: which compiled form of each kernel family (`rust/kernels/<family>.cu`)
//! runs on this GPU, and the function handles inside it.
//!
//! Order of preference for a GPU of compute capability `sm` (e.g. 90):
//! 1. a cubin embedded at build time (`FAK_CUDA_ARCH`) for the same major architecture and a
//!    minor ≤ the GPU's (binary compatible);
//! 2. a cubin compiled earlier by NVRTC and cached on disk under
//!    `~/.cache/fak/kernels/<hash>/<family>.sm_<sm>.cubin` (`<hash>` covers the source, the NVRTC
//!    options and NVRTC's version);
//! 3. NVRTC now (then cached);
//! 4. the embedded PTX of an older architecture, compiled by the driver's JIT.
//! `FAK_CUDA_KERNELS=nvrtc` skips the embedded cubins (tests the NVRTC path on a per-arch wheel).

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use cudarc::nvrtc::sys as nv;

use super::device::{backend_err, drv, guarded, Device};
use crate::Result;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/fak_kernels.rs"));
}
pub use embedded::{BUILD_ARCHS, CUBINS, PTX, SOURCES};

/// Where a family's loaded image came from (reported by `fak doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageOrigin {
    /// nvcc cubin embedded in the extension at build time, for `sm_<n>`.
    EmbeddedCubin(u32),
    /// NVRTC cubin read from the disk cache.
    NvrtcCache(PathBuf),
    /// NVRTC cubin compiled at this start-up (and written to the cache).
    Nvrtc(PathBuf),
    /// Embedded PTX of `compute_<n>` compiled by the driver's JIT.
    PtxJit(u32),
}

impl std::fmt::Display for ImageOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageOrigin::EmbeddedCubin(a) => write!(f, "embedded sm_{a} cubin (nvcc, build time)"),
            ImageOrigin::NvrtcCache(p) => write!(f, "NVRTC cubin from cache {}", p.display()),
            ImageOrigin::Nvrtc(p) => write!(f, "NVRTC cubin compiled at start-up, cached at {}", p.display()),
            ImageOrigin::PtxJit(a) => write!(f, "embedded compute_{a} PTX, JIT-compiled by the driver"),
        }
    }
}

impl ImageOrigin {
    /// The architecture the image was compiled for (`sm`: the GPU's, for NVRTC images).
    fn arch(&self, sm: u32) -> u32 {
        match self {
            ImageOrigin::EmbeddedCubin(a) | ImageOrigin::PtxJit(a) => *a,
            ImageOrigin::NvrtcCache(_) | ImageOrigin::Nvrtc(_) => sm,
        }
    }
}

/// Whether kernels compiled for `arch` wait for the kernel before them (`pdl_enter()` in
/// `common.cuh` is compiled in from sm_90 on), so that they may be launched with programmatic
/// stream serialization.
pub fn pdl_capable(arch: u32) -> bool {
    arch >= 90
}

/// Families launched without programmatic stream serialization by default: the int8 GEMMs.
/// Started early beside the kernel before them, their blocks were placed on the SMs that kernel
/// left room on: a decode step of 64 sequences on the 1.5B twin took 5.95 ms instead of 5.06
/// (H100, 2026-12-06; benches/results/cuda.md, run h3), and a 512-token prefill 20% longer. The
/// kernels after them still start early (the GEMMs call `pdl_enter()` as every kernel does).
pub const PDL_SKIP_DEFAULT: &[&str] = &["mmq"];

/// Whether `family`'s launches go without programmatic stream serialization: those of
/// [`PDL_SKIP_DEFAULT`], or of `FAK_CUDA_PDL_SKIP` when set (comma-separated; empty: none), for
/// measuring which launches gain from it.
fn pdl_skipped(family: &str) -> bool {
    match std::env::var("FAK_CUDA_PDL_SKIP") {
        Ok(v) => v.split(',').any(|f| f.trim() == family),
        Err(_) => PDL_SKIP_DEFAULT.contains(&family),
    }
}

struct Loaded {
    module: sys::CUmodule,
    origin: ImageOrigin,
    /// Its launches may use programmatic stream serialization: the image's kernels wait for the
    /// kernel before them ([`pdl_capable`]) and the family is not skipped ([`pdl_skipped`]).
    pdl: bool,
}

/// All kernel families loaded on one device.
pub struct Kernels {
    dev: Arc<Device>,
    families: HashMap<&'static str, Loaded>,
    /// Loaded functions, the dynamic shared memory their opt-in limit was last raised to, and
    /// whether their image may be launched early (see [`pdl_capable`]).
    funcs: Mutex<HashMap<&'static str, (sys::CUfunction, usize, bool)>>,
}

// SAFETY: module and function handles are immutable once loaded and valid in the device's
// context, which every user binds first.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

/// NVRTC options (also part of the cache key).
fn nvrtc_options(sm: u32) -> Vec<String> {
    vec![format!("--gpu-architecture=sm_{sm}"), "-std=c++17".into()]
}

/// FNV-1a, 64 bits (cache keys; not security relevant).
fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// `$XDG_CACHE_HOME/fak/kernels` or `~/.cache/fak/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("FAK_KERNEL_CACHE") {
        return Some(PathBuf::from(x));
    }
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("fak").join("kernels"))
}

/// Loads libnvrtc when it is not on the loader's path: `FAK_NVRTC_LIB` (a file), then the
/// directories in `FAK_NVIDIA_LIB_DIRS` (the Python side fills it with the `nvidia/*/lib` folders
/// of installed wheels), `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`. A library loaded by path
/// satisfies cudarc's later load by name (same soname).
fn ensure_nvrtc() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: dlopen of library names cudarc knows.
        if std::panic::catch_unwind(|| unsafe { nv::is_culib_present() }).unwrap_or(false) {
            return Ok(());
        }
        let mut tried = Vec::new();
        let mut cands: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("FAK_NVRTC_LIB") {
            cands.push(PathBuf::from(p));
        }
        let mut dirs: Vec<PathBuf> = std::env::var_os("FAK_NVIDIA_LIB_DIRS").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
        if let Some(h) = std::env::var_os("CUDA_HOME") {
            dirs.push(PathBuf::from(h).join("lib64"));
        }
        dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
        for d in dirs {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                cands.push(d.join(name));
            }
        }
        for c in cands {
            if !c.is_file() {
                continue;
            }
            tried.push(c.display().to_string());
            // SAFETY: loading NVIDIA's NVRTC library; it stays loaded for the process.
            if let Ok(lib) = unsafe { libloading::Library::new(&c) } {
                std::mem::forget(lib);
                // NVRTC dlopens its builtins library by name; load it from the same folder.
                if let Some(dir) = c.parent() {
                    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt.") {
                            // SAFETY: NVIDIA's NVRTC builtins library; stays loaded.
                            if let Ok(b) = unsafe { libloading::Library::new(e.path()) } {
                                std::mem::forget(b);
                            }
                        }
                    }
                }
                if std::panic::catch_unwind(|| unsafe { nv::is_culib_present() }).unwrap_or(false) {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no NVRTC library (libnvrtc.so) could be loaded (tried the loader path{}{}); install nvidia-cuda-nvrtc or use a wheel built with FAK_CUDA_ARCH for this GPU",
            if tried.is_empty() { "" } else { " and " },
            tried.join(", ")
        ))
    })
    .clone()
    .map_err(backend_err)
}

/// NVRTC's version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    guarded("nvrtcVersion", || {
        let (mut a, mut b) = (0, 0);
        // SAFETY: valid out-pointers.
        let r = unsafe { nv::nvrtcVersion(&mut a, &mut b) };
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(backend_err(format!("nvrtcVersion: {r:?}")));
        }
        Ok((a, b))
    })
}

/// Compiles one family's source to a cubin for `sm_<sm>` with NVRTC. No GPU is needed.
///
/// Errors: [`crate::FakError::Backend`] with NVRTC's log when compilation fails.
pub fn nvrtc_compile(family: &str, src: &str, sm: u32) -> Result<Vec<u8>> {
    ensure_nvrtc()?;
    guarded("NVRTC", || {
        let csrc = CString::new(src).map_err(|_| backend_err("kernel source contains a NUL byte"))?;
        let cname = CString::new(format!("{family}.cu")).unwrap();
        let opts: Vec<CString> = nvrtc_options(sm).into_iter().map(|o| CString::new(o).unwrap()).collect();
        let optp: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: NVRTC C API with valid C strings; the program is destroyed on every path.
        unsafe {
            let mut prog = std::ptr::null_mut();
            let r = nv::nvrtcCreateProgram(&mut prog, csrc.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null());
            if r != nv::nvrtcResult::NVRTC_SUCCESS {
                return Err(backend_err(format!("nvrtcCreateProgram({family}): {r:?}")));
            }
            let r = nv::nvrtcCompileProgram(prog, optp.len() as i32, optp.as_ptr());
            let mut log_n = 0usize;
            nv::nvrtcGetProgramLogSize(prog, &mut log_n);
            let mut log = vec![0u8; log_n.max(1)];
            nv::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut std::ffi::c_char);
            let log = CStr::from_bytes_until_nul(&log).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
            if r != nv::nvrtcResult::NVRTC_SUCCESS {
                nv::nvrtcDestroyProgram(&mut prog);
                return Err(backend_err(format!("NVRTC failed to compile {family}.cu for sm_{sm}: {r:?}\n{log}")));
            }
            let mut n = 0usize;
            let r = nv::nvrtcGetCUBINSize(prog, &mut n);
            if r != nv::nvrtcResult::NVRTC_SUCCESS || n == 0 {
                nv::nvrtcDestroyProgram(&mut prog);
                return Err(backend_err(format!("nvrtcGetCUBINSize({family}): {r:?}")));
            }
            let mut cubin = vec![0u8; n];
            let r = nv::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut std::ffi::c_char);
            nv::nvrtcDestroyProgram(&mut prog);
            if r != nv::nvrtcResult::NVRTC_SUCCESS {
                return Err(backend_err(format!("nvrtcGetCUBIN({family}): {r:?}")));
            }
            Ok(cubin)
        }
    })
}

/// The NVRTC image of `family` for `sm`: from the disk cache, or compiled and cached.
fn nvrtc_image(family: &str, src: &str, sm: u32) -> Result<(Vec<u8>, ImageOrigin)> {
    let (va, vb) = nvrtc_version()?;
    let opts = nvrtc_options(sm).join(" ");
    let ver = format!("nvrtc {va}.{vb}");
    let key = fnv64(&[src.as_bytes(), opts.as_bytes(), ver.as_bytes()]);
    let dir = cache_dir().map(|d| d.join(format!("{key:016x}")));
    let file = dir.as_ref().map(|d| d.join(format!("{family}.sm_{sm}.cubin")));
    if let Some(f) = &file {
        if let Ok(bytes) = std::fs::read(f) {
            if !bytes.is_empty() {
                return Ok((bytes, ImageOrigin::NvrtcCache(f.clone())));
            }
        }
    }
    let cubin = nvrtc_compile(family, src, sm)?;
    let mut origin_path = PathBuf::from("(not cached: no cache directory)");
    if let (Some(d), Some(f)) = (&dir, &file) {
        // Write to a temporary name and rename, so a concurrent reader never sees half a file.
        if std::fs::create_dir_all(d).is_ok() {
            let tmp = d.join(format!(".{family}.sm_{sm}.{}.tmp", std::process::id()));
            if std::fs::write(&tmp, &cubin).is_ok() && std::fs::rename(&tmp, f).is_ok() {
                origin_path = f.clone();
            }
        }
    }
    Ok((cubin, ImageOrigin::Nvrtc(origin_path)))
}

impl Kernels {
    /// Loads every family for `dev` (see the module doc for the order of preference).
    pub fn load(dev: &Arc<Device>) -> Result<Kernels> {
        dev.bind()?;
        let sm = dev.info.sm();
        let force_nvrtc = std::env::var("FAK_CUDA_KERNELS").map(|v| v.eq_ignore_ascii_case("nvrtc")).unwrap_or(false);
        // Families without an embedded cubin for this GPU: NVRTC (cache or compile), in parallel.
        let pick_cubin = |family: &str| {
            if force_nvrtc {
                None
            } else {
                CUBINS.iter().filter(|(f, a, _)| *f == family && a / 10 == sm / 10 && *a <= sm).max_by_key(|(_, a, _)| *a)
            }
        };
        let need: Vec<(&'static str, &'static str)> = SOURCES.iter().copied().filter(|(f, _)| pick_cubin(f).is_none()).collect();
        let compiled: Vec<(&'static str, Result<(Vec<u8>, ImageOrigin)>)> = std::thread::scope(|s| {
            let hs: Vec<_> = need.iter().map(|&(f, src)| (f, s.spawn(move || nvrtc_image(f, src, sm)))).collect();
            hs.into_iter().map(|(f, h)| (f, h.join().unwrap_or_else(|_| Err(backend_err(format!("NVRTC thread for {f} panicked")))))).collect()
        });
        let mut compiled: HashMap<&'static str, Result<(Vec<u8>, ImageOrigin)>> = compiled.into_iter().collect();
        let mut families = HashMap::new();
        for &(family, _) in SOURCES {
            let loaded = if let Some((_, a, bytes)) = pick_cubin(family) {
                Loaded { module: load_image(family, bytes)?, origin: ImageOrigin::EmbeddedCubin(*a), pdl: false }
            } else {
                match compiled.remove(family).expect("compiled above") {
                    Ok((bytes, origin)) => Loaded { module: load_image(family, &bytes)?, origin, pdl: false },
                    Err(e) => {
                        // Last resort: PTX of an older architecture through the driver's JIT.
                        let ptx = PTX.iter().filter(|(f, a, _)| *f == family && *a <= sm).max_by_key(|(_, a, _)| *a);
                        match ptx {
                            Some((_, a, text)) if !force_nvrtc => {
                                let mut z = text.as_bytes().to_vec();
                                z.push(0);
                                Loaded { module: load_image(family, &z)?, origin: ImageOrigin::PtxJit(*a), pdl: false }
                            }
                            _ => return Err(e),
                        }
                    }
                }
            };
            let loaded = Loaded { pdl: pdl_capable(loaded.origin.arch(sm)) && !pdl_skipped(family), ..loaded };
            families.insert(family, loaded);
        }
        Ok(Kernels { dev: dev.clone(), families, funcs: Mutex::new(HashMap::new()) })
    }

    /// Where each family's image came from.
    pub fn origins(&self) -> Vec<(&'static str, ImageOrigin)> {
        let mut v: Vec<_> = self.families.iter().map(|(k, l)| (*k, l.origin.clone())).collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// The families whose launches may start early (capable, not skipped), sorted.
    pub fn pdl_families(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self.families.iter().filter(|(_, l)| l.pdl).map(|(f, _)| *f).collect();
        v.sort();
        v
    }

    /// The kernel `name` of `family` (handles are cached), and whether its image may be launched
    /// early ([`pdl_capable`]). A launch with `smem` bytes of dynamic shared memory raises the
    /// function's opt-in limit to it when it was lower.
    pub fn func(&self, family: &'static str, name: &'static str, smem: usize) -> Result<(sys::CUfunction, bool)> {
        let mut map = self.funcs.lock().unwrap_or_else(|e| e.into_inner());
        let (f, pdl) = match map.get(name) {
            Some(&(f, limit, pdl)) if smem <= limit => return Ok((f, pdl)),
            Some(&(f, _, pdl)) => (f, pdl),
            None => {
                let l = self.families.get(family).ok_or_else(|| backend_err(format!("kernel family {family} is not loaded")))?;
                let cname = CString::new(name).unwrap();
                let mut f = std::ptr::null_mut();
                self.dev.bind()?;
                // SAFETY: valid module handle and C string.
                drv(&format!("cuModuleGetFunction({name})"), unsafe { sys::cuModuleGetFunction(&mut f, l.module, cname.as_ptr()) })?;
                (f, l.pdl)
            }
        };
        if smem > 0 {
            // Raise the opt-in limit of dynamic shared memory (by default 48 KiB minus the
            // kernel's static shared memory, which a kernel with both can exceed with less than
            // 48 KiB of dynamic memory) to what this launch asks for.
            self.dev.bind()?;
            // SAFETY: valid function handle.
            drv(&format!("cuFuncSetAttribute({name})"), unsafe {
                sys::cuFuncSetAttribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            })?;
        }
        map.insert(name, (f, smem, pdl));
        Ok((f, pdl))
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            for l in self.families.values() {
                // SAFETY: modules loaded in `load`; nothing uses them after the backend is gone.
                unsafe {
                    let _ = sys::cuModuleUnload(l.module);
                }
            }
        }
    }
}

fn load_image(family: &str, image: &[u8]) -> Result<sys::CUmodule> {
    let mut log = vec![0u8; 16384];
    let mut opts = [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    let mut vals = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let mut m = std::ptr::null_mut();
    // SAFETY: `image` is a cubin or NUL-terminated PTX; the option arrays match.
    let r = unsafe { sys::cuModuleLoadDataEx(&mut m, image.as_ptr() as *const c_void, 2, opts.as_mut_ptr(), vals.as_mut_ptr()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        let text = CStr::from_bytes_until_nul(&log).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        return drv(&format!("loading kernel family {family} ({text})"), r).map(|_| std::ptr::null_mut());
    }
    Ok(m)
}
