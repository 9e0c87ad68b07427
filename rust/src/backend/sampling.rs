//! The ops the engine's device sampling runs on logits rows that stay on the backend
//! (`engine/device_sample.rs`): each row's exact top `m` with its log-normalizer, sparse
//! penalties applied in place, and one temperature draw from a whole row. The functions here are
//! the reference the CPU backend runs and the CUDA kernels (`kernels/sampling.cu`) are checked
//! against; their numerics are the host sampler's own (`engine/sampler.rs`), so on the CPU the
//! device path gives the host path's tokens bit for bit.

use super::cpu::vecops;

/// A change to one logit before sampling: `v ← (v ≤ 0 ? v·repeat : v/repeat) − delta` (the
/// repetition penalty, then the presence/frequency penalties; `repeat` 1 and `delta` 0 leave `v`
/// unchanged). Layout shared with the CUDA kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitPenalty {
    /// Logits row.
    pub row: u32,
    pub token: u32,
    pub repeat: f32,
    pub delta: f32,
}

impl LogitPenalty {
    /// The penalized value of `v`.
    pub fn apply(&self, v: f32) -> f32 {
        (if v <= 0.0 { v * self.repeat } else { v / self.repeat }) - self.delta
    }
}

/// One draw from a whole row at a temperature: the first token (index order) whose running sum of
/// weights `e^((x − max)·inv_temp)` passes `u · Σ weights`. Layout shared with the CUDA kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawRequest {
    /// Logits row.
    pub row: u32,
    pub inv_temp: f32,
    /// Uniform in [0, 1), from the sequence's generator.
    pub u: f64,
}

/// The top `m` entries of each selected row, largest first in IEEE total order (Rust's
/// `f32::total_cmp`), ties lower id first: the order the host sampler sorts candidates in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopRows {
    /// Entries per row.
    pub m: usize,
    /// `[rows · m]`.
    pub ids: Vec<u32>,
    /// `[rows · m]`, the logits at `ids`.
    pub vals: Vec<f32>,
    /// Per row: the largest non-NaN value (as the host's `log_normalizer`).
    pub max: Vec<f32>,
    /// Per row: `Σ e^(x − max)` over the whole row, in f64.
    pub z: Vec<f64>,
    /// Per row: whether `ids` is exactly the host order's first `m` (false when the ties at the
    /// `m`-th value were too many for the device to order by id).
    pub exact: Vec<bool>,
}

impl TopRows {
    /// Empties it for `n` rows of `m` entries.
    pub fn reset(&mut self, n: usize, m: usize) {
        self.m = m;
        self.ids.clear();
        self.ids.resize(n * m, 0);
        self.vals.clear();
        self.vals.resize(n * m, 0.0);
        self.max.clear();
        self.max.resize(n, 0.0);
        self.z.clear();
        self.z.resize(n, 0.0);
        self.exact.clear();
        self.exact.resize(n, false);
    }

    /// Row `r`'s ids and values.
    pub fn row(&self, r: usize) -> (&[u32], &[f32]) {
        let m = self.m;
        (&self.ids[r * m..(r + 1) * m], &self.vals[r * m..(r + 1) * m])
    }
}

/// What `Backend::draw_rows` returns per draw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrawnRows {
    pub tokens: Vec<u32>,
    /// The logit at each token.
    pub vals: Vec<f32>,
    /// The row's largest non-NaN value and `Σ e^(x − max)` (f64, temperature 1): the host's
    /// `log_normalizer`, for the log-probability.
    pub max: Vec<f32>,
    pub z: Vec<f64>,
}

impl DrawnRows {
    /// Sized for `n` draws.
    pub fn reset(&mut self, n: usize) {
        self.tokens.clear();
        self.tokens.resize(n, 0);
        self.vals.clear();
        self.vals.resize(n, 0.0);
        self.max.clear();
        self.max.resize(n, 0.0);
        self.z.clear();
        self.z.resize(n, 0.0);
    }

    /// Entry `i` from `row` and its request: the reference of `Backend::draw_rows`.
    pub fn reference(&mut self, i: usize, row: &[f32], d: &DrawRequest, weights: &mut Vec<f32>) {
        let t = draw_row(row, d.inv_temp, d.u, weights);
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        self.tokens[i] = t;
        self.vals[i] = row[t as usize];
        self.max[i] = max;
        self.z[i] = vecops::exp_scaled_sum(row, max, 1.0, None);
    }
}

/// The reference of `Backend::top_rows` for one row (`m ≤ row.len()`), written into entry `r`.
pub fn top_row(row: &[f32], m: usize, out: &mut TopRows, r: usize) {
    let by = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    if m < idx.len() {
        idx.select_nth_unstable_by(m - 1, by);
        idx.truncate(m);
    }
    idx.sort_unstable_by(by);
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for (k, &t) in idx.iter().enumerate() {
        out.ids[r * m + k] = t;
        out.vals[r * m + k] = row[t as usize];
    }
    out.max[r] = max;
    out.z[r] = vecops::exp_scaled_sum(row, max, 1.0, None);
    out.exact[r] = true;
}

/// The reference of `Backend::draw_rows` for one row: the host sampler's whole-vocabulary draw
/// with the uniform `u`. `weights` is scratch.
pub fn draw_row(row: &[f32], inv_temp: f32, u: f64, weights: &mut Vec<f32>) -> u32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    weights.resize(row.len(), 0.0);
    let total = vecops::exp_scaled_sum(row, max, inv_temp, Some(weights));
    draw_u(u, weights, total, |i| i as u32)
}

/// Index `i` drawn with probability `w[i] / total` by the uniform `u` (index order over positive
/// weights; the last positive one when rounding leaves the sum short of the target), mapped
/// through `id`.
pub fn draw_u(u: f64, w: &[f32], total: f64, id: impl Fn(usize) -> u32) -> u32 {
    let target = u * total;
    let mut cum = 0f64;
    let mut last = 0;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            cum += x as f64;
            last = i;
            if cum > target {
                return id(i);
            }
        }
    }
    id(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_row_orders_by_total_order_then_id() {
        let row = [1.0, 3.0, 3.0, -0.0, 0.0, 2.0, f32::NEG_INFINITY];
        let mut t = TopRows::default();
        t.reset(1, 5);
        top_row(&row, 5, &mut t, 0);
        assert_eq!(t.ids, vec![1, 2, 5, 0, 4]);
        assert_eq!(t.vals, vec![3.0, 3.0, 2.0, 1.0, 0.0]);
        assert_eq!(t.max[0], 3.0);
        let z: f64 = row.iter().map(|&v| ((v - 3.0) as f64).exp()).sum();
        assert!((t.z[0] - z).abs() < 1e-6 * z, "{} vs {z}", t.z[0]);
    }

    #[test]
    fn penalty_is_the_host_semantics() {
        let p = LogitPenalty { row: 0, token: 0, repeat: 1.5, delta: 0.25 };
        assert_eq!(p.apply(3.0), 3.0 / 1.5 - 0.25);
        assert_eq!(p.apply(-3.0), -3.0 * 1.5 - 0.25);
        let none = LogitPenalty { row: 0, token: 0, repeat: 1.0, delta: 0.0 };
        for v in [-0.0f32, 0.0, 1e-30, -7.5, f32::MAX] {
            assert_eq!(none.apply(v).to_bits(), v.to_bits());
        }
    }

    #[test]
    fn draw_u_walks_positive_weights_in_order() {
        let w = [0.0, 1.0, 0.0, 2.0, 1.0];
        let id = |i: usize| i as u32;
        assert_eq!(draw_u(0.0, &w, 4.0, id), 1);
        assert_eq!(draw_u(0.24, &w, 4.0, id), 1);
        assert_eq!(draw_u(0.25, &w, 4.0, id), 3);
        assert_eq!(draw_u(0.76, &w, 4.0, id), 4);
        // rounding past the end: the last positive weight
        assert_eq!(draw_u(0.999, &w, 5.0, id), 4);
    }
}
