//! Device sampling: a step whose rows are not all plain greedy samples them without copying the
//! logits to the host (`n_rows · n_vocab` floats, ~39 MB at 64 rows of Qwen2.5's vocabulary).
//! Per step, at most four small round trips:
//!
//! 1. the exact top [`DEVICE_TOP`] of every row with its normalizer (the unmodified logits:
//!    log-probabilities, and the candidates of rows without penalties), except rows that only
//!    draw from the whole vocabulary, whose normalizer comes with the draw;
//! 2. the rows' penalties applied in place (`(row, token)` entries; the old values come back);
//! 3. the top again of the penalized rows;
//! 4. one whole-row temperature draw for each row that samples the whole vocabulary, with the
//!    uniform its own generator gives, and the row's max and `Σ e^(x − max)`.
//!
//! Each sequence's `Sampler` then finishes its token from these (`Sampler::finish_device`) by
//! the host path's code; a row they do not decide (a nucleus wider than the candidates, prefix
//! choices, ties the device could not order) is copied alone, its penalized logits restored, and
//! sampled on the host. On the CPU backend the ops are the host sampler's own, so the tokens and
//! log-probabilities are the host path's bit for bit (`tests::device_sampling_equals_host`); on
//! CUDA the normalizers and the draw's weights are the GPU's own `expf` sums (a token differs only
//! where the draw lands within rounding of a boundary between two tokens).

use super::sampler::{DevicePlan, DeviceRow, DEVICE_TOP};
use super::{Sequence, StepOutput};
use crate::backend::{Backend, DrawRequest, DrawnRows, LogitPenalty, TopRows};
use crate::Result;

/// Buffers reused across steps.
#[derive(Default)]
pub(super) struct DeviceSampling {
    raw: TopRows,
    pen: TopRows,
    pens: Vec<LogitPenalty>,
    pen_old: Vec<f32>,
    draws: Vec<DrawRequest>,
    drawn: DrawnRows,
    row: Vec<f32>,
}

impl DeviceSampling {
    /// Samples every `(logits row, sequence)` of `work` from `logits` (`[rows, n_vocab]` on the
    /// backend; penalized in place). Outputs in `work`'s order, and how many rows went to the host
    /// sampler.
    pub(super) fn sample<B: Backend>(
        &mut self,
        backend: &B,
        logits: &mut B::Buffer,
        n_vocab: usize,
        work: &mut [(usize, &mut Sequence)],
    ) -> Result<(Vec<(usize, StepOutput)>, u64)> {
        let plans: Vec<DevicePlan> = work
            .iter()
            .map(|(_, s)| s.sampler.device_plan(&s.tokens, n_vocab))
            .collect();
        let m = DEVICE_TOP.min(n_vocab);
        // Rows of the device-sampled sequences, and where each one's entries land.
        let mut dev_rows = Vec::new();
        let mut pen_rows = Vec::new();
        let mut pen_span = vec![(0usize, 0usize); work.len()];
        let mut pen_at = vec![usize::MAX; work.len()];
        let mut raw_at = vec![usize::MAX; work.len()];
        let mut on_device = vec![false; work.len()];
        let mut draw_at = vec![usize::MAX; work.len()];
        self.pens.clear();
        self.draws.clear();
        for (w, ((j, s), plan)) in work.iter().zip(&plans).enumerate() {
            let DevicePlan::Device { penalties, draw } = plan else { continue };
            on_device[w] = true;
            // A plain draw takes its normalizer from the draw itself: no candidates needed.
            if !(draw.is_some() && penalties.is_empty() && s.sampler.params().n_logprobs == 0) {
                raw_at[w] = dev_rows.len();
                dev_rows.push(*j as u32);
            }
            if !penalties.is_empty() {
                if draw.is_none() {
                    // candidates of the penalized row (a whole-row draw needs none)
                    pen_at[w] = pen_rows.len();
                    pen_rows.push(*j as u32);
                }
                let start = self.pens.len();
                self.pens.extend(penalties.iter().map(|&(token, repeat, delta)| LogitPenalty {
                    row: *j as u32,
                    token,
                    repeat,
                    delta,
                }));
                pen_span[w] = (start, self.pens.len());
            }
            if let Some((inv_temp, u)) = *draw {
                draw_at[w] = self.draws.len();
                self.draws.push(DrawRequest { row: *j as u32, inv_temp, u });
            }
        }
        backend.top_rows(logits, n_vocab, &dev_rows, m, &mut self.raw)?;
        self.pen_old.resize(self.pens.len(), 0.0);
        backend.penalize_rows(logits, n_vocab, &self.pens, &mut self.pen_old)?;
        backend.top_rows(logits, n_vocab, &pen_rows, m, &mut self.pen)?;
        backend.draw_rows(logits, n_vocab, &self.draws, &mut self.drawn)?;

        let mut out = Vec::with_capacity(work.len());
        let mut on_host = 0;
        for (w, (j, s)) in work.iter_mut().enumerate() {
            let (a, b) = pen_span[w];
            let sampled = if !on_device[w] {
                None
            } else if raw_at[w] == usize::MAX {
                // a plain draw: its row's normalizer came with it
                let d = draw_at[w];
                s.sampler.finish_device(&DeviceRow {
                    n_vocab,
                    ids: &[],
                    vals: &[],
                    exact: true,
                    max: self.drawn.max[d],
                    z: self.drawn.z[d],
                    raw_ids: &[],
                    raw_vals: &[],
                    raw_exact: true,
                    raw_max: self.drawn.max[d],
                    raw_z: self.drawn.z[d],
                    raw_penalized: &[],
                    drawn: Some((self.drawn.tokens[d], self.drawn.vals[d])),
                })
            } else {
                let r = raw_at[w];
                let (raw_ids, raw_vals) = self.raw.row(r);
                let (top, t) = if pen_at[w] == usize::MAX { (&self.raw, r) } else { (&self.pen, pen_at[w]) };
                let (ids, vals) = top.row(t);
                let raw_penalized: Vec<(u32, f32)> =
                    self.pens[a..b].iter().zip(&self.pen_old[a..b]).map(|(p, &v)| (p.token, v)).collect();
                let drawn = (draw_at[w] != usize::MAX).then(|| (self.drawn.tokens[draw_at[w]], self.drawn.vals[draw_at[w]]));
                s.sampler.finish_device(&DeviceRow {
                    n_vocab,
                    ids,
                    vals,
                    exact: top.exact[t],
                    max: top.max[t],
                    z: top.z[t],
                    raw_ids,
                    raw_vals,
                    raw_exact: self.raw.exact[r],
                    raw_max: self.raw.max[r],
                    raw_z: self.raw.z[r],
                    raw_penalized: &raw_penalized,
                    drawn,
                })
            };
            let sampled = match sampled {
                Some(x) => x,
                None => {
                    // This row on the host, its logits as the model gave them.
                    on_host += 1;
                    self.row.resize(n_vocab, 0.0);
                    backend.read_row_f32(logits, *j, n_vocab, &mut self.row)?;
                    for (p, &v) in self.pens[a..b].iter().zip(&self.pen_old[a..b]) {
                        self.row[p.token as usize] = v;
                    }
                    s.sampler.sample(&self.row, &s.tokens)
                }
            };
            out.push((
                *j,
                StepOutput {
                    seq_id: s.id,
                    token: sampled.token,
                    logprob: sampled.logprob,
                    top_logprobs: sampled.top_logprobs,
                    finish: None,
                },
            ));
        }
        Ok((out, on_host))
    }
}
