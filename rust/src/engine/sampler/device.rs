//! The sampler's half of device sampling (`engine/device_sample.rs` runs the backend's ops): what
//! a sequence's next token needs from the device ([`Sampler::device_plan`]), and the token finished
//! on the host from what came back ([`Sampler::finish_device`]) — the top [`DEVICE_TOP`] of its
//! logits, their normalizer, or one whole-row draw — by the same code and numerics as
//! [`Sampler::sample`] over the whole row. Where those do not decide the token (a nucleus wider
//! than the candidates, ties the device could not order), `finish_device` says so and the engine
//! copies that row and samples it on the host; the generator is advanced only by the path that
//! decides, so the token stream is the host path's either way.

use super::{nucleus_cut, penalty_entries, Sampled, Sampler};

/// Candidates per row the device returns (top-k up to this many is decided from them).
pub const DEVICE_TOP: usize = 256;

/// What the next token of one sequence needs from the device.
#[derive(Debug, Clone, PartialEq)]
pub enum DevicePlan {
    /// Its logits row on the host and [`Sampler::sample`] (prefix choices restrict it to tokens
    /// the candidates need not hold; top-k above [`DEVICE_TOP`]).
    Host,
    /// The device's candidates of its logits after `penalties` (`(token, repeat, delta)`, see
    /// [`penalty_entries`]), and `draw` (`(1/temperature, uniform)`) when it draws from the whole
    /// vocabulary.
    Device {
        penalties: Vec<(u32, f32, f32)>,
        draw: Option<(f32, f64)>,
    },
}

/// What came back from the device for one row.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRow<'a> {
    pub n_vocab: usize,
    /// Top candidates of the penalized logits (the raw ones when there are no penalties), sorted
    /// as the host sorts (logit descending in total order, ties lower id first), with their
    /// logits; `exact`: they are the host order's first `ids.len()`.
    pub ids: &'a [u32],
    pub vals: &'a [f32],
    pub exact: bool,
    /// Largest non-NaN penalized logit, and `Σ e^(l − max)` (f64).
    pub max: f32,
    pub z: f64,
    /// The same of the unmodified logits (log-probabilities describe the model).
    pub raw_ids: &'a [u32],
    pub raw_vals: &'a [f32],
    pub raw_exact: bool,
    pub raw_max: f32,
    pub raw_z: f64,
    /// `(token, unmodified logit)` of each penalized token.
    pub raw_penalized: &'a [(u32, f32)],
    /// The device's whole-row draw `(token, penalized logit)`, when the plan asked for one.
    pub drawn: Option<(u32, f32)>,
}

impl Sampler {
    /// What the next token needs from the device, with `history` the sequence so far.
    pub fn device_plan(&self, history: &[u32], n_vocab: usize) -> DevicePlan {
        let p = &self.params;
        if self.choices.is_some() || (p.top_k as usize > DEVICE_TOP && (p.top_k as usize) < n_vocab) {
            return DevicePlan::Host;
        }
        let penalties = if p.has_penalties() {
            let mut e = penalty_entries(p, history, &self.counts);
            e.retain(|x| (x.0 as usize) < n_vocab); // as `apply_penalties`' bounds check
            e
        } else {
            Vec::new()
        };
        let top_k_on = p.top_k > 0 && (p.top_k as usize) < n_vocab;
        let filtered = top_k_on || p.top_p < 1.0 || p.min_p > 0.0;
        let draw = (p.temperature > 0.0 && !filtered)
            .then(|| (1.0 / p.temperature, self.rng.clone().next_f64()));
        DevicePlan::Device { penalties, draw }
    }

    /// The token from what the device returned (`r`), as [`Sampler::sample`] would pick it from
    /// the whole row; `None` when `r` does not decide it (then sample the row on the host). The
    /// caller then [`accept`](Sampler::accept)s the token as usual.
    pub fn finish_device(&mut self, r: &DeviceRow) -> Option<Sampled> {
        let p = &self.params;
        let n = r.n_vocab;
        let nan = |v: &[f32]| v.first().is_none_or(|x| x.is_nan());
        let n_lp = p.n_logprobs;
        if n_lp > 0 && (!r.raw_exact || r.raw_ids.len() < n_lp || r.raw_vals[..n_lp].iter().any(|v| v.is_nan())) {
            return None;
        }
        let (token, val) = if let Some(d) = r.drawn {
            self.rng.next_f64(); // the uniform the device drew with
            d
        } else {
            if !r.exact || nan(r.vals) {
                return None;
            }
            if p.temperature <= 0.0 {
                (r.ids[0], r.vals[0])
            } else {
                let complete = r.ids.len() == n;
                let top_k = if p.top_k > 0 && (p.top_k as usize) < n { p.top_k as usize } else { 0 };
                let c = if top_k > 0 {
                    if top_k > r.ids.len() {
                        return None;
                    }
                    top_k
                } else if p.top_p < 1.0 {
                    match nucleus_cut(r.vals.iter().copied(), r.max, r.z, p.top_p) {
                        Some(c) => c,
                        None if complete => r.ids.len(),
                        None => return None,
                    }
                } else {
                    let min_logit = r.max + p.min_p.ln();
                    let keep = r.vals.iter().take_while(|&&v| v >= min_logit).count();
                    if keep == r.ids.len() && !complete {
                        return None;
                    }
                    keep
                };
                let renorm = top_k > 0 && p.top_p < 1.0;
                let t = self.finish_sorted(&r.ids[..c], &r.vals[..c], renorm);
                let at = r.ids.iter().position(|&i| i == t).expect("drawn from the candidates");
                (t, r.vals[at])
            }
        };
        let raw = r.raw_penalized.iter().find(|x| x.0 == token).map_or(val, |x| x.1);
        let ln_z = r.raw_z.ln() as f32;
        let top_logprobs = (n_lp > 0).then(|| {
            r.raw_ids[..n_lp]
                .iter()
                .zip(&r.raw_vals[..n_lp])
                .map(|(&t, &v)| (t, (v - r.raw_max) - ln_z))
                .collect()
        });
        Some(Sampled {
            token,
            logprob: (raw - r.raw_max) - ln_z,
            top_logprobs,
        })
    }
}
