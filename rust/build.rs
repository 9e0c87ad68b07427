//! Build script: embeds fak's CUDA kernels (`rust/kernels/*.cu`) when the `cuda` feature is on.
//!
//! - Always (feature `cuda`): each kernel family's source, with `#include "common.cuh"` inlined, is
//!   embedded so that the run time can compile it with NVRTC for whatever GPU it finds.
//! - With `FAK_CUDA_ARCH=sm_90` (a comma list is allowed: `sm_80,sm_89,sm_90`): every family is
//!   also compiled with nvcc to a cubin per architecture, plus one PTX for the newest listed
//!   architecture (the driver JIT-compiles it on newer GPUs), and those images are embedded.
//!   `FAK_NVCC` names the compiler; otherwise `nvcc` on PATH, `$CUDA_HOME/bin/nvcc`,
//!   `/usr/local/cuda/bin/nvcc`, then the PyPI `nvidia-cuda-nvcc` package of `python3`
//!   (`site-packages/nvidia/cu13/bin/nvcc`). FAK_CUDA_ARCH with no nvcc is a build error.
//!
//! Output: `$OUT_DIR/fak_kernels.rs` (included by `backend/cuda/module.rs`) and, per family and
//! architecture, the ptxas resource report `$OUT_DIR/ptxas/<family>.<arch>.log`.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const KERNEL_DIR: &str = "rust/kernels";
const HEADER: &str = "common.cuh";

fn main() {
    println!("cargo:rerun-if-changed=rust/build.rs");
    println!("cargo:rerun-if-changed={KERNEL_DIR}");
    println!("cargo:rerun-if-env-changed=FAK_CUDA_ARCH");
    println!("cargo:rerun-if-env-changed=FAK_NVCC");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let kdir = root.join(KERNEL_DIR);
    let header = fs::read_to_string(kdir.join(HEADER)).unwrap_or_else(|e| panic!("reading {KERNEL_DIR}/{HEADER}: {e}"));
    println!("cargo:rerun-if-changed={KERNEL_DIR}/{HEADER}");

    let mut families: Vec<(String, PathBuf)> = fs::read_dir(&kdir)
        .unwrap_or_else(|e| panic!("reading {KERNEL_DIR}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    families.sort();

    // Sources with the header inlined (NVRTC gets one self-contained translation unit).
    let src_dir = out.join("kernel_src");
    fs::create_dir_all(&src_dir).expect("create kernel_src");
    let mut sources = Vec::new();
    for (name, path) in &families {
        println!("cargo:rerun-if-changed={}", path.display());
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let inlined = text.replace(&format!("#include \"{HEADER}\""), &format!("// ---- {HEADER} (inlined by build.rs) ----\n{header}\n// ---- end {HEADER} ----"));
        let dst = src_dir.join(format!("{name}.cu"));
        fs::write(&dst, inlined).expect("write inlined source");
        sources.push((name.clone(), dst));
    }

    let archs: Vec<u32> = match env::var("FAK_CUDA_ARCH") {
        Ok(s) if !s.trim().is_empty() => s.split(',').map(|a| parse_arch(a.trim())).collect(),
        _ => Vec::new(),
    };
    let mut images: Vec<(String, u32, PathBuf)> = Vec::new();
    let mut ptx: Vec<(String, u32, PathBuf)> = Vec::new();
    if !archs.is_empty() {
        let nvcc = find_nvcc();
        let img_dir = out.join("images");
        let log_dir = out.join("ptxas");
        fs::create_dir_all(&img_dir).expect("create images dir");
        fs::create_dir_all(&log_dir).expect("create ptxas dir");
        let newest = *archs.iter().max().unwrap();
        let mut jobs: Vec<(String, u32, bool)> = Vec::new();
        for (name, _) in &families {
            for &a in &archs {
                jobs.push((name.clone(), a, false));
            }
            jobs.push((name.clone(), newest, true));
        }
        // Two compilers at a time (the build machines have few cores).
        let results: Vec<Result<(String, u32, bool, PathBuf), String>> = std::thread::scope(|s| {
            let mut out_v = Vec::new();
            for chunk in jobs.chunks(2) {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|(name, a, is_ptx)| {
                        let (nvcc, kdir, img_dir, log_dir) = (&nvcc, &kdir, &img_dir, &log_dir);
                        s.spawn(move || compile(nvcc, kdir, img_dir, log_dir, name, *a, *is_ptx).map(|p| (name.clone(), *a, *is_ptx, p)))
                    })
                    .collect();
                for h in handles {
                    out_v.push(h.join().expect("nvcc thread"));
                }
            }
            out_v
        });
        for r in results {
            match r {
                Ok((name, a, true, p)) => ptx.push((name, a, p)),
                Ok((name, a, false, p)) => images.push((name, a, p)),
                Err(e) => panic!("{e}"),
            }
        }
    }

    let mut gen = String::new();
    gen.push_str("// Generated by rust/build.rs: the embedded CUDA kernel sources and images.\n");
    let _ = writeln!(gen, "/// Architectures compiled by nvcc at build time (FAK_CUDA_ARCH), e.g. `[90]`.\npub const BUILD_ARCHS: &[u32] = &{archs:?};");
    gen.push_str("/// `(family, source with common.cuh inlined)` for NVRTC.\npub const SOURCES: &[(&str, &str)] = &[\n");
    for (name, p) in &sources {
        let _ = writeln!(gen, "    ({name:?}, include_str!({:?})),", p.display().to_string());
    }
    gen.push_str("];\n/// `(family, sm, cubin)` compiled by nvcc.\npub const CUBINS: &[(&str, u32, &[u8])] = &[\n");
    for (name, a, p) in &images {
        let _ = writeln!(gen, "    ({name:?}, {a}, include_bytes!({:?})),", p.display().to_string());
    }
    gen.push_str("];\n/// `(family, compute capability, PTX)` of the newest architecture, for the driver's JIT.\npub const PTX: &[(&str, u32, &str)] = &[\n");
    for (name, a, p) in &ptx {
        let _ = writeln!(gen, "    ({name:?}, {a}, include_str!({:?})),", p.display().to_string());
    }
    gen.push_str("];\n");
    fs::write(out.join("fak_kernels.rs"), gen).expect("write fak_kernels.rs");
}

fn parse_arch(a: &str) -> u32 {
    let digits = a.trim_start_matches("sm_").trim_start_matches("compute_");
    match digits.parse::<u32>() {
        Ok(n) if (50..=130).contains(&n) => n,
        _ => panic!("FAK_CUDA_ARCH: {a:?} is not an architecture like sm_80, sm_89, sm_90"),
    }
}

fn find_nvcc() -> PathBuf {
    if let Some(p) = env::var_os("FAK_NVCC") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return p;
        }
        panic!("FAK_NVCC={} is not a file; point it at nvcc (e.g. site-packages/nvidia/cu13/bin/nvcc)", p.display());
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    if let Some(h) = env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(h).join("bin/nvcc"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    for py in ["python3", "python"] {
        if let Ok(o) = Command::new(py).args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'nvcc'))"]).output() {
            if o.status.success() {
                candidates.push(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
            }
        }
    }
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!(
            "FAK_CUDA_ARCH is set but no nvcc was found (FAK_NVCC, PATH, CUDA_HOME, /usr/local/cuda, python3's nvidia package). \
             Install it with: pip install nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
             nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85, or unset FAK_CUDA_ARCH to build the NVRTC-only wheel"
        )
    })
}

fn compile(nvcc: &Path, kdir: &Path, img_dir: &Path, log_dir: &Path, name: &str, arch: u32, is_ptx: bool) -> Result<PathBuf, String> {
    let src = kdir.join(format!("{name}.cu"));
    let (ext, flag, gpu) = if is_ptx { ("ptx", "-ptx", format!("-arch=compute_{arch}")) } else { ("cubin", "-cubin", format!("-arch=sm_{arch}")) };
    let dst = img_dir.join(format!("{name}.sm_{arch}.{ext}"));
    let mut cmd = Command::new(nvcc);
    cmd.arg(flag).arg(&gpu).args(["-O3", "-std=c++17", "-lineinfo"]).arg("-I").arg(kdir).arg("-o").arg(&dst).arg(&src);
    if !is_ptx {
        cmd.arg("-Xptxas=-v");
    }
    let o = cmd.output().map_err(|e| format!("running {}: {e}", nvcc.display()))?;
    let log = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    if !o.status.success() {
        return Err(format!("nvcc failed on {} for sm_{arch}:\n{log}", src.display()));
    }
    if !is_ptx {
        let _ = fs::write(log_dir.join(format!("{name}.sm_{arch}.log")), &log);
        for line in log.lines().filter(|l| l.contains("spill") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads")) {
            println!("cargo:warning={name}.cu sm_{arch}: {}", line.trim());
        }
    }
    Ok(dst)
}
