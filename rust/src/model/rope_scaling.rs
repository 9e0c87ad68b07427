//! RoPE scaling for contexts longer than a model was trained on: which scheme, read from GGUF
//! metadata under llama.cpp's key names (`llama-arch.cpp`: `{arch}.rope.scaling.type`,
//! `.rope.scaling.factor`, `.rope.scale_linear`, `.rope.scaling.original_context_length`,
//! `.rope.scaling.attn_factor`, `.rope.scaling.yarn_ext_factor`, `.rope.scaling.yarn_beta_fast`,
//! `.rope.scaling.yarn_beta_slow`) or set by the caller ([`RopeOverride`]: `fak serve
//! --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768`), resolved into [`RopeParams`] the way
//! llama.cpp's `llama_context` resolves its `cparams` (`llama-context.cpp`), so that the same
//! settings give llama.cpp's angles:
//!
//! - `none`: `freq_scale = 1` whatever the factor says;
//! - `linear`: position interpolation, `freq_scale = 1/factor` (Chen et al. 2023);
//! - `yarn`: YaRN (Peng et al. 2023, arXiv:2309.00071), `freq_scale = 1/factor`, `ext_factor = 1`,
//!   correction dimensions from the original context and `β_fast = 32`, `β_slow = 1`, and
//!   llama.cpp's magnitude: `attn_factor = (0.1·ln factor + 1) / (1 + 0.1·ln factor) ·
//!   rope.scaling.attn_factor`, which the kernel multiplies by `1 + 0.1·ln(1/freq_scale)` again;
//! - `llama3`: Llama 3.1's NTK-by-parts. llama.cpp runs it as per-pair frequency factors, the
//!   `rope_freqs.weight` tensor its converter writes; a file that has it needs nothing else. Set
//!   explicitly, fak computes the same factors itself ([`llama3_freq_factors`], the formula of
//!   Meta's `apply_scaling` as the GGUF converter evaluates it) and uses them instead of the file's.
//!
//! Unset (no key in the file, no override), the parameters are [`RopeParams::plain`] and the
//! angles are bit-identical to fak's before scaling existed.

use crate::backend::{RopeParams, RopeStyle};
use crate::{FakError, Result};

/// A RoPE scaling scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingKind {
    None,
    Linear,
    Yarn,
    Llama3,
}

impl RopeScalingKind {
    /// Parses `none`, `linear`, `yarn`, `llama3` (also the GGUF spelling); anything else is
    /// [`FakError::Unsupported`] naming it (`longrope` is llama.cpp's, not fak's).
    pub fn from_name(name: &str) -> Result<RopeScalingKind> {
        match name {
            "none" => Ok(RopeScalingKind::None),
            "linear" => Ok(RopeScalingKind::Linear),
            "yarn" => Ok(RopeScalingKind::Yarn),
            "llama3" => Ok(RopeScalingKind::Llama3),
            other => Err(FakError::Unsupported(format!(
                "RoPE scaling type {other:?}; fak supports \"none\", \"linear\", \"yarn\" and \"llama3\""
            ))),
        }
    }

    /// The name [`Self::from_name`] parses.
    pub fn name(self) -> &'static str {
        match self {
            RopeScalingKind::None => "none",
            RopeScalingKind::Linear => "linear",
            RopeScalingKind::Yarn => "yarn",
            RopeScalingKind::Llama3 => "llama3",
        }
    }
}

/// RoPE scaling settings from the caller; each `None` falls back to the file's metadata, then to
/// llama.cpp's default. Mirrors llama.cpp's context parameters (`rope_scaling_type`,
/// `rope_freq_scale` as `1/factor`, `yarn_orig_ctx`, `yarn_ext_factor`, `yarn_beta_fast`,
/// `yarn_beta_slow`) plus Llama 3.1's `low_freq_factor` / `high_freq_factor`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RopeOverride {
    pub kind: Option<RopeScalingKind>,
    /// Context extension factor (`rope.scaling.factor`; > 0).
    pub factor: Option<f32>,
    /// Context the model was trained on before extension, in tokens
    /// (`rope.scaling.original_context_length`; default `context_length`, 8192 for llama3).
    pub orig_ctx: Option<usize>,
    /// YaRN extrapolation mix (default 1 for yarn, 0 otherwise).
    pub ext_factor: Option<f32>,
    /// YaRN β_fast / β_slow (defaults 32 / 1).
    pub beta_fast: Option<f32>,
    pub beta_slow: Option<f32>,
    /// Llama 3.1 low / high frequency factors (defaults 1 / 4).
    pub low_freq_factor: Option<f32>,
    pub high_freq_factor: Option<f32>,
}

impl RopeOverride {
    /// Whether nothing is set (the file decides everything).
    pub fn is_unset(&self) -> bool {
        *self == RopeOverride::default()
    }
}

/// The scaling a model runs with, resolved ([`resolve`]); reported in `EngineCore.config`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeScaling {
    pub kind: RopeScalingKind,
    /// Extension factor (1 for none).
    pub factor: f32,
    /// Original (pre-extension) context in tokens.
    pub orig_ctx: usize,
    /// Per-pair frequency factors fak computed for `llama3` (`[n_rot/2]`), used instead of the
    /// file's `rope_freqs.weight`; `None` otherwise.
    pub freq_factors: Option<Vec<f32>>,
}

/// What the file says (`None` where a key is absent).
#[derive(Debug, Clone, Default)]
pub struct RopeMeta {
    pub kind: Option<String>,
    pub factor: Option<f32>,
    pub orig_ctx: Option<usize>,
    pub attn_factor: Option<f32>,
    pub ext_factor: Option<f32>,
    pub beta_fast: Option<f32>,
    pub beta_slow: Option<f32>,
    pub yarn_log_mul: Option<f32>,
}

fn positive(what: &str, v: f32) -> Result<f32> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(FakError::invalid(what, format!("{v} (must be a positive number)")))
    }
}

/// Resolves the file's metadata `meta` and the caller's `ov` into RoPE parameters, as
/// llama.cpp's `llama_context` does (see the module header). `n_ctx_train` is
/// `{arch}.context_length`.
///
/// Errors: [`FakError::Unsupported`] for a scheme fak does not run (`longrope`, a YaRN
/// `yarn_log_multiplier`); [`FakError::InvalidArgument`] naming a non-positive factor the caller
/// gave; [`FakError::Model`] for a non-positive factor in the file.
pub fn resolve(
    style: RopeStyle,
    n_rot: usize,
    freq_base: f32,
    n_ctx_train: usize,
    meta: &RopeMeta,
    ov: &RopeOverride,
) -> Result<(RopeParams, RopeScaling)> {
    // llama.cpp reads a missing `rope.scaling.type` as "linear" (with no factor: no scaling).
    let kind = match ov.kind {
        Some(k) => k,
        None => match meta.kind.as_deref() {
            None | Some("") => RopeScalingKind::Linear,
            Some(name) => RopeScalingKind::from_name(name)?,
        },
    };
    let factor = match ov.factor {
        Some(f) => Some(positive("rope_scale", f)?),
        None => match meta.factor {
            Some(f) if f == 0.0 => None,
            Some(f) if f.is_finite() && f > 0.0 => Some(f),
            Some(f) => return Err(FakError::model(format!("metadata rope.scaling.factor {f} must be positive"))),
            None => None,
        },
    };
    let orig_ctx = ov.orig_ctx.or(meta.orig_ctx).filter(|&n| n > 0);
    let file_attn = meta.attn_factor.unwrap_or(1.0);
    let mut p = RopeParams::plain(style, n_rot, freq_base);
    let mut scaling = RopeScaling {
        kind,
        factor: 1.0,
        orig_ctx: orig_ctx.unwrap_or(n_ctx_train),
        freq_factors: None,
    };
    match kind {
        RopeScalingKind::None => {}
        RopeScalingKind::Linear | RopeScalingKind::Yarn => {
            let f = factor.unwrap_or(1.0);
            p.freq_scale = 1.0 / f;
            scaling.factor = f;
        }
        RopeScalingKind::Llama3 => {
            let f = factor.unwrap_or(8.0);
            let orig = orig_ctx.unwrap_or(8192);
            scaling.factor = f;
            scaling.orig_ctx = orig;
            scaling.freq_factors = Some(llama3_freq_factors(
                n_rot,
                freq_base,
                f,
                positive("low_freq_factor", ov.low_freq_factor.unwrap_or(1.0))?,
                positive("high_freq_factor", ov.high_freq_factor.unwrap_or(4.0))?,
                orig,
            )?);
        }
    }
    let ext_factor = match ov.ext_factor.or(meta.ext_factor.filter(|&e| e >= 0.0)) {
        Some(e) => e,
        None if kind == RopeScalingKind::Yarn => 1.0,
        None => 0.0,
    };
    if ext_factor != 0.0 {
        if meta.yarn_log_mul.is_some_and(|m| m != 0.0) {
            return Err(FakError::Unsupported(
                "YaRN with rope.scaling.yarn_log_multiplier (DeepSeek-style mscale)".into(),
            ));
        }
        // llama.cpp: yarn_attn_factor = get_mscale(factor, 1) / (1 + 0.1 ln factor), in f32,
        // each step rounded (libllama is built without FMA contraction).
        let factor = 1.0 / p.freq_scale;
        let mscale = if factor <= 1.0 { 1.0 } else { 0.1f32 * 1.0 * factor.ln() + 1.0 };
        let cancel = 1.0f32 / (1.0 + 0.1f32 * factor.ln());
        p.attn_factor = mscale * cancel;
        p.ext_factor = ext_factor;
        p.corr_dims = RopeParams::yarn_corr_dims(
            n_rot,
            scaling.orig_ctx,
            freq_base,
            ov.beta_fast.or(meta.beta_fast).unwrap_or(32.0),
            ov.beta_slow.or(meta.beta_slow).unwrap_or(1.0),
        );
    }
    p.attn_factor *= file_attn;
    Ok((p, scaling))
}

/// Llama 3.1's NTK-by-parts frequency factors `[n_rot/2]` (Meta's `apply_scaling`, as llama.cpp's
/// GGUF converter writes them into `rope_freqs.weight`): pair `i` with frequency
/// `ω = base^(−2i/n_rot)` and wavelength `λ = 2π/ω` keeps `ω` (factor 1) when `λ < orig/high`,
/// is divided by `factor` when `λ > orig/low`, and in between by `1 / ((1 − s)/factor + s)` with
/// `s = (orig/λ − low) / (high − low)`. The angle of pair `i` is then divided by its factor.
/// Computed in f64 and rounded to f32 (the converter's torch float32 frequencies differ from
/// these in the last bit at most; the factors are exactly 1 or `factor` outside the band).
///
/// Errors: `high_freq_factor ≤ low_freq_factor`.
pub fn llama3_freq_factors(
    n_rot: usize,
    freq_base: f32,
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    orig_ctx: usize,
) -> Result<Vec<f32>> {
    if high_freq_factor <= low_freq_factor {
        return Err(FakError::invalid(
            "high_freq_factor",
            format!("{high_freq_factor} (must be larger than low_freq_factor {low_freq_factor})"),
        ));
    }
    let orig = orig_ctx as f64;
    let (low, high, factor) = (low_freq_factor as f64, high_freq_factor as f64, factor as f64);
    let low_wavelen = orig / low;
    let high_wavelen = orig / high;
    Ok((0..n_rot / 2)
        .map(|i| {
            // the converter's float32 frequency, widened
            let freq = 1.0 / (freq_base as f64).powf((2 * i) as f64 / n_rot as f64) as f32 as f64;
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(meta: RopeMeta, ov: RopeOverride) -> (RopeParams, RopeScaling) {
        resolve(RopeStyle::Neox, 64, 1e6, 32768, &meta, &ov).unwrap()
    }

    #[test]
    fn unset_is_plain() {
        let (p, s) = res(RopeMeta::default(), RopeOverride::default());
        assert_eq!(p, RopeParams::plain(RopeStyle::Neox, 64, 1e6));
        assert_eq!(s.kind, RopeScalingKind::Linear);
        assert_eq!(s.factor, 1.0);
    }

    #[test]
    fn none_ignores_the_factor_linear_uses_it() {
        let meta = RopeMeta { kind: Some("none".into()), factor: Some(4.0), ..Default::default() };
        assert_eq!(res(meta.clone(), RopeOverride::default()).0.freq_scale, 1.0);
        let ov = RopeOverride { kind: Some(RopeScalingKind::Linear), ..Default::default() };
        let (p, _) = res(meta, ov);
        assert_eq!((p.freq_scale, p.ext_factor, p.attn_factor), (0.25, 0.0, 1.0));
    }

    #[test]
    fn yarn_qwen25_128k() {
        // Qwen2.5's model card: {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
        let ov = RopeOverride {
            kind: Some(RopeScalingKind::Yarn),
            factor: Some(4.0),
            orig_ctx: Some(32768),
            ..Default::default()
        };
        let (p, s) = res(RopeMeta::default(), ov.clone());
        assert_eq!(p.freq_scale, 0.25);
        assert_eq!(p.ext_factor, 1.0);
        assert_eq!(p.corr_dims, RopeParams::yarn_corr_dims(64, 32768, 1e6, 32.0, 1.0));
        // attn_factor · (1 + 0.1 ln 4) ≈ 1 + 0.1 ln 4 (llama.cpp's cancellation)
        assert!((p.attn_factor - 1.0).abs() < 1e-6, "{}", p.attn_factor);
        assert_eq!((s.kind, s.factor, s.orig_ctx), (RopeScalingKind::Yarn, 4.0, 32768));
        // the same from metadata
        let meta = RopeMeta {
            kind: Some("yarn".into()),
            factor: Some(4.0),
            orig_ctx: Some(32768),
            ..Default::default()
        };
        assert_eq!(res(meta, RopeOverride::default()).0, p);
    }

    #[test]
    fn rejects_bad_values() {
        let meta = RopeMeta { kind: Some("longrope".into()), ..Default::default() };
        assert!(resolve(RopeStyle::Neox, 64, 1e6, 32768, &meta, &RopeOverride::default()).is_err());
        let ov = RopeOverride { kind: Some(RopeScalingKind::Yarn), factor: Some(0.0), ..Default::default() };
        assert!(resolve(RopeStyle::Neox, 64, 1e6, 32768, &RopeMeta::default(), &ov).is_err());
    }

    #[test]
    fn llama3_factors_band() {
        // Llama 3.1 8B: base 500000, head_dim 128, factor 8, low 1, high 4, original 8192.
        let f = llama3_freq_factors(128, 500000.0, 8.0, 1.0, 4.0, 8192).unwrap();
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0));
    }
}
