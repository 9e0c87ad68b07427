//! Which SIMD path the CPU matmul runs: detected once at run time from what the CPU and the OS
//! enable (`is_x86_feature_detected!`, which checks CPUID and XCR0), optionally lowered by the
//! `FAK_CPU_SIMD` environment variable (`scalar`, `avx2`, `avx512`) for tests and benches.
//! AMX is never used (llama.cpp's AMX path faults on the machines fak targets).

use std::sync::OnceLock;

/// A SIMD instruction-set level, ordered from the portable fallback up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable Rust, no intrinsics; also the test oracle.
    Scalar,
    /// AVX2 + FMA + F16C (256-bit integer `maddubs` dot products).
    Avx2,
    /// AVX-512 F/BW/DQ/VL + VNNI (`vpdpbusd`), plus AVX-512 BF16 when present.
    Avx512,
}

impl SimdLevel {
    /// The level's name as `FAK_CPU_SIMD` spells it.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// The level named `name` (`scalar`, `avx2`, `avx512`; case-insensitive).
    pub fn from_name(name: &str) -> Option<SimdLevel> {
        match name.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(SimdLevel::Scalar),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            _ => None,
        }
    }
}

/// The highest level this CPU (and OS) supports, ignoring `FAK_CPU_SIMD`.
pub fn detected_level() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        if avx512 {
            return SimdLevel::Avx512;
        }
        if avx2 {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}

/// The levels this machine can run, lowest first (the scalar fallback always).
pub fn available_levels() -> Vec<SimdLevel> {
    let top = detected_level();
    [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512].into_iter().filter(|l| *l <= top).collect()
}

/// The level the matmul uses: the detected one, lowered to `FAK_CPU_SIMD` when that names a lower
/// (or equal) level. A higher level than the CPU has, or an unknown name, is ignored (with a note on
/// stderr), so a typo can never select instructions the CPU lacks.
pub fn active_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let top = detected_level();
        match std::env::var("FAK_CPU_SIMD") {
            Ok(v) if !v.trim().is_empty() => match SimdLevel::from_name(&v) {
                Some(l) if l <= top => l,
                Some(l) => {
                    eprintln!("fak: FAK_CPU_SIMD={} is not supported by this CPU; using {}", l.name(), top.name());
                    top
                }
                None => {
                    eprintln!("fak: FAK_CPU_SIMD={v:?} is not one of scalar|avx2|avx512; using {}", top.name());
                    top
                }
            },
            _ => top,
        }
    })
}
