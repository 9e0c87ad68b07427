//! Vector kernels the CPU ops share (f16 ↔ f32 conversion, dot products, scaled accumulation,
//! exp), with an AVX2 + FMA + F16C path chosen at run time and a portable fallback.
//!
//! f16 rounding is round-to-nearest-even, as F16C's `vcvtps2ph` with `_MM_FROUND_TO_NEAREST_INT`
//! and ggml's `GGML_FP32_TO_FP16` on x86.

use std::sync::OnceLock;

/// The instruction-set level the kernels run at, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA + F16C (x86-64-v3).
    Avx2,
}

/// The best level this CPU and OS support (`FAK_CPU_ISA=scalar` forces the fallback).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("FAK_CPU_ISA").is_ok_and(|v| v.eq_ignore_ascii_case("scalar")) {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
}

/// `1 / (1 + e^(−x))` (ggml's scalar `sigmoid`, `expf` as Rust's `exp`).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / (1 + e^(−x))` (ggml's scalar `ggml_silu_f32`).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `dst[i] = f16(src[i])` (bits), round to nearest even.
pub fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected at run time.
        unsafe { avx2::f32_to_f16(src, dst) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(s).to_bits();
    }
}

/// `dst[i] = f32(src[i])` for f16 bits `src`.
pub fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected at run time.
        unsafe { avx2::f16_to_f32(src, dst) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_bits(s).to_f32();
    }
}

/// Rounds every element to the nearest f16 value (ties to even) and back, in place.
pub fn round_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected at run time.
        unsafe { avx2::round_f16(x) };
        return;
    }
    for v in x.iter_mut() {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

/// `x[i] = e^(x[i] − m)` in place; returns `Σ x[i]` (f32 lanes, f64 across chunks, as ggml's
/// `ggml_vec_soft_max_f32` sums in `ggml_float`).
pub fn exp_scaled_sum_inplace(x: &mut [f32], m: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected at run time.
        return unsafe { avx2::exp_sum_inplace(x, m) };
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v as f64;
    }
    sum
}

/// ggml's `ggml_v_expf` (AVX-512 form) for one value: the scalar twin of `avx2::expf_ggml`
/// (same operations, `mul_add` for the FMAs), for the portable paths.
#[allow(clippy::excessive_precision)]
pub fn expf_ggml(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000);
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    if n.is_nan() {
        return f32::NAN;
    }
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    let ni = n as i32;
    let (n1, n2) = (ni >> 1, ni - (ni >> 1));
    let p = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    (j * p(n1)) * p(n2)
}

/// Sum of 16 values as GCC's `_mm512_reduce_add_ps` adds its lanes.
pub fn reduce16(v: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| v[8 + i] + v[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[4 + i] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// Softmax numerator in place with llama.cpp's numerics (ggml `ggml_vec_soft_max_f32`, AVX-512
/// build): `x[i] = ggml_v_expf(x[i] − m)`; returns `Σ x[i]`, summed per 16 elements from index 0
/// by [`reduce16`] and across groups in f64 (a last partial group as if padded with zeros).
pub fn softmax_exp_sum(x: &mut [f32], m: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected at run time.
        return unsafe { avx2::softmax_exp_sum(x, m) };
    }
    let mut total = 0f64;
    for chunk in x.chunks_mut(16) {
        let mut v = [0f32; 16];
        for (o, e) in v.iter_mut().zip(chunk.iter_mut()) {
            *e = expf_ggml(*e - m);
            *o = *e;
        }
        total += reduce16(&v) as f64;
    }
    total
}

/// Hints the CPU to bring `data` into cache (no effect off x86-64). Used one KV block ahead in
/// attention, where the hardware prefetcher stops at each (scattered) block boundary.
#[inline]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = data.as_ptr() as *const i8;
        let bytes = std::mem::size_of_val(data);
        let mut off = 0;
        while off < bytes {
            // SAFETY: prefetch never faults; the address lies inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// SiLU-gated product in place: `gate[i] = gate[i] / (1 + e^−gate[i]) · up[i]`, with ggml's
/// `ggml_vec_swiglu_f32` numerics (AVX-512 build: `ggml_v_silu` with `ggml_v_expf`), element-wise.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected at run time.
        unsafe { avx2::swiglu(gate, up) };
        return;
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + expf_ggml(-*g)) * u;
    }
}

/// `out[i] = e^((x[i] − m) · s)`; returns `Σ out[i]` (accumulated in f64 across lanes).
/// With `out = None` only the sum is computed. Used for softmax over a vocabulary.
pub fn exp_scaled_sum(x: &[f32], m: f32, s: f32, out: Option<&mut [f32]>) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected at run time.
        return unsafe { avx2::exp_scaled_sum(x, m, s, out) };
    }
    let mut sum = 0f64;
    match out {
        Some(o) => {
            for (o, &v) in o.iter_mut().zip(x) {
                *o = ((v - m) * s).exp();
                sum += *o as f64;
            }
        }
        None => {
            for &v in x {
                sum += ((v - m) * s).exp() as f64;
            }
        }
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2 + FMA + F16C kernels. Every function requires those features (callers check
    //! [`super::isa`]).

    use std::arch::x86_64::*;

    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            i += 8;
        }
        for j in i..n {
            dst[j] = half::f16::from_f32(src[j]).to_bits();
        }
    }

    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for j in i..n {
            dst[j] = half::f16::from_bits(src[j]).to_f32();
        }
    }

    /// Horizontal sum of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// e^x for 8 lanes (Cephes-style: range reduction by ln 2, degree-6 polynomial, ≤ 2 ulp for
    /// x in [−87, 88]; lanes below −87.3 give 0, as llama.cpp's `ggml_v_expf` does).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::excessive_precision)]
    pub fn exp(x: __m256) -> __m256 {
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949));
        let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3365447505531));
        // n = round(x / ln2), r = x − n·ln2 (ln2 split hi/lo for accuracy).
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4), r);
        let mut p = _mm256_set1_ps(1.9875691500e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1));
        let r2 = _mm256_mul_ps(r, r);
        p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
        // scale by 2^n
        let ni = _mm256_cvtps_epi32(n);
        let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            ni,
            _mm256_set1_epi32(127),
        )));
        _mm256_andnot_ps(underflow, _mm256_mul_ps(p, pow2n))
    }

    /// `2^n · j` for integral `n` with |n| ≤ 192, rounded once (AVX-512's `vscalefps`): two exact
    /// power-of-two factors, the second product rounds.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scalef(j: __m256, n: __m256) -> __m256 {
        let ni = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let p = |k: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127))));
        _mm256_mul_ps(_mm256_mul_ps(j, p(n1)), p(n2))
    }

    /// e^x for 8 lanes exactly as llama.cpp's x86 AVX-512 build computes it: ggml-cpu `vec.h`
    /// `ggml_v_expf(__m512)` (ARM optimized-routines polynomial, `n = round(x/ln2)` by the 1.5·2^23
    /// trick, result `scalef(j, n)`; |n| > 192 gives 0 or +inf). Used where llama.cpp uses it
    /// (softmax, SiLU) so that results are bit-identical.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn expf_ggml(x: __m256) -> __m256 {
        let c = |b: u32| _mm256_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        let res = scalef(j, _mm256_andnot_ps(d, n));
        if _mm256_movemask_ps(d) == 0 {
            return res;
        }
        let le0 = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
        let alt = _mm256_andnot_ps(le0, _mm256_set1_ps(f32::INFINITY));
        _mm256_blendv_ps(res, alt, d)
    }

    /// The 16 lanes `(lo, hi)` of a 512-bit vector summed as GCC's `_mm512_reduce_add_ps`:
    /// `((lo + hi)` folded 128 → 64 → 32 bits).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn reduce16(lo: __m256, hi: __m256) -> f32 {
        hsum(_mm256_add_ps(hi, lo))
    }

    /// `x[i] = ggml_v_expf(x[i] − m)`, returns `Σ x[i]` as ggml's `ggml_vec_soft_max_f32` sums
    /// on AVX-512: per 16 elements (from index 0) [`reduce16`], added in f64. A last partial group
    /// is summed as if padded with zeros (llama.cpp's masked `e^−∞` entries).
    ///
    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax_exp_sum(x: &mut [f32], m: f32) -> f64 {
        let mv = _mm256_set1_ps(m);
        let n = x.len();
        let mut total = 0f64;
        let mut i = 0;
        let mut pad = [0f32; 16];
        while i < n {
            let k = (n - i).min(16);
            let chunk: *mut f32 = if k == 16 {
                x.as_mut_ptr().add(i)
            } else {
                pad = [f32::NEG_INFINITY; 16];
                pad[..k].copy_from_slice(&x[i..n]);
                pad.as_mut_ptr()
            };
            let lo = expf_ggml(_mm256_sub_ps(_mm256_loadu_ps(chunk), mv));
            let hi = expf_ggml(_mm256_sub_ps(_mm256_loadu_ps(chunk.add(8)), mv));
            _mm256_storeu_ps(chunk, lo);
            _mm256_storeu_ps(chunk.add(8), hi);
            total += reduce16(lo, hi) as f64;
            if k < 16 {
                x[i..n].copy_from_slice(&pad[..k]);
            }
            i += 16;
        }
        total
    }

    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_scaled_sum(x: &[f32], m: f32, s: f32, mut out: Option<&mut [f32]>) -> f64 {
        let (mv, sv) = (_mm256_set1_ps(m), _mm256_set1_ps(s));
        let n = x.len();
        let mut total = 0f64;
        let mut i = 0;
        // Sum 8 lanes in f32 over chunks of 1024 elements, then in f64.
        while i + 8 <= n {
            let end = (i + 1024).min(n - n % 8);
            let mut acc = _mm256_setzero_ps();
            while i < end {
                let e = exp(_mm256_mul_ps(
                    _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), mv),
                    sv,
                ));
                if let Some(o) = out.as_deref_mut() {
                    _mm256_storeu_ps(o.as_mut_ptr().add(i), e);
                }
                acc = _mm256_add_ps(acc, e);
                i += 8;
            }
            total += hsum(acc) as f64;
        }
        for j in i..n {
            let e = ((x[j] - m) * s).exp();
            if let Some(o) = out.as_deref_mut() {
                o[j] = e;
            }
            total += e as f64;
        }
        total
    }

    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn round_f16(x: &mut [f32]) {
        let n = x.len();
        let mut i = 0;
        while i + 8 <= n {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_ps(x.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for v in &mut x[i..] {
            *v = half::f16::from_f32(*v).to_f32();
        }
    }

    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_sum_inplace(x: &mut [f32], m: f32) -> f64 {
        let mv = _mm256_set1_ps(m);
        let n = x.len();
        let mut total = 0f64;
        let mut i = 0;
        while i + 8 <= n {
            let end = (i + 1024).min(n - n % 8);
            let mut acc = _mm256_setzero_ps();
            while i < end {
                let e = exp(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), mv));
                _mm256_storeu_ps(x.as_mut_ptr().add(i), e);
                acc = _mm256_add_ps(acc, e);
                i += 8;
            }
            total += hsum(acc) as f64;
        }
        for v in &mut x[i..] {
            *v = (*v - m).exp();
            total += *v as f64;
        }
        total
    }

    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = expf_ggml(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
            i += 8;
        }
        for j in i..n {
            gate[j] = super::silu(gate[j]) * up[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_matches_half() {
        let src: Vec<f32> = (0..37)
            .map(|i| (i as f32 - 18.3) * 0.731)
            .chain([65504.0, 1e-8, -0.0])
            .collect();
        let mut h = vec![0u16; src.len()];
        f32_to_f16(&src, &mut h);
        for (s, b) in src.iter().zip(&h) {
            assert_eq!(*b, half::f16::from_f32(*s).to_bits(), "{s}");
        }
        let mut back = vec![0f32; src.len()];
        f16_to_f32(&h, &mut back);
        for (b, hb) in back.iter().zip(&h) {
            assert_eq!(*b, half::f16::from_bits(*hb).to_f32());
        }
    }

    #[test]
    fn round_f16_and_exp_sum() {
        let x0: Vec<f32> = (0..29).map(|i| (i as f32 - 14.2) * 0.377).collect();
        let mut x = x0.clone();
        round_f16(&mut x);
        for (a, b) in x.iter().zip(&x0) {
            assert_eq!(*a, half::f16::from_f32(*b).to_f32());
        }
        let mut e = x0.clone();
        let sum = exp_scaled_sum_inplace(&mut e, 2.0);
        let want: f64 = x0.iter().map(|&v| ((v - 2.0) as f64).exp()).sum();
        assert!((sum - want).abs() <= 1e-6 * want);
        for (a, b) in e.iter().zip(&x0) {
            assert!(
                ((*a as f64) - ((*b - 2.0) as f64).exp()).abs() <= 1e-6 * (*a as f64).max(1e-30)
            );
        }
    }

    #[test]
    fn swiglu_matches_formula() {
        let g0: Vec<f32> = (0..45).map(|i| (i as f32 - 22.0) * 0.9).collect();
        let up: Vec<f32> = (0..45).map(|i| 1.0 + i as f32 * 0.1).collect();
        let mut g = g0.clone();
        swiglu(&mut g, &up);
        for i in 0..g.len() {
            let x = g0[i] as f64;
            let want = x / (1.0 + (-x).exp()) * up[i] as f64;
            assert!(
                (g[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{i}: {} vs {want}",
                g[i]
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_exp_accuracy() {
        if isa() != Isa::Avx2 {
            return;
        }
        use std::arch::x86_64::*;
        let mut x = -100.0f32;
        while x < 88.0 {
            let mut out = [0f32; 8];
            // SAFETY: AVX2 detected above.
            unsafe {
                let v = avx2::exp(_mm256_set1_ps(x));
                _mm256_storeu_ps(out.as_mut_ptr(), v);
            }
            let want = (x as f64).exp();
            let tol = if want < 1e-37 { 1e-37 } else { want * 3e-7 };
            assert!(
                ((out[0] as f64) - want).abs() <= tol,
                "exp({x}) = {} want {want}",
                out[0]
            );
            x += 0.173;
        }
    }

    /// ggml's `ggml_v_expf`: the AVX2 and scalar forms agree bit for bit, are within 2 ulp of
    /// e^x, and flush like ggml's AVX-512 form (0 below about −104, +inf from 88.7).
    #[test]
    fn expf_ggml_matches_itself_and_exp() {
        let xs: Vec<f32> = (0..4000).map(|i| -110.0 + i as f32 * 0.05).chain([0.0, -0.0, 1e-8]).collect();
        let mut simd = xs.clone();
        #[cfg(target_arch = "x86_64")]
        if isa() == Isa::Avx2 {
            use std::arch::x86_64::*;
            for c in simd.chunks_exact_mut(8) {
                // SAFETY: AVX2/FMA detected; the chunk holds 8 floats.
                unsafe { _mm256_storeu_ps(c.as_mut_ptr(), avx2::expf_ggml(_mm256_loadu_ps(c.as_ptr()))) };
            }
            for (i, &x) in xs.iter().enumerate().take(xs.len() / 8 * 8) {
                assert_eq!(simd[i].to_bits(), expf_ggml(x).to_bits(), "x = {x}");
            }
        }
        for &x in &xs {
            let (got, want) = (expf_ggml(x) as f64, (x as f64).exp());
            if x < -104.0 {
                assert_eq!(got, 0.0);
            } else if want > 1e-37 && x < 88.0 {
                assert!((got - want).abs() <= 2.5 * want * f32::EPSILON as f64, "x = {x}: {got} vs {want}");
            }
        }
        assert_eq!(expf_ggml(100.0), f32::INFINITY);
    }
}
