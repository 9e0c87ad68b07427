//! Token sampling: penalties, greedy, temperature, top-k, top-p, min-p, a seeded RNG per
//! sequence, and log-probabilities.
//!
//! Order and semantics follow llama.cpp's default sampler chain (`common/sampling.cpp`:
//! penalties → top-k → top-p → min-p → temperature → dist):
//! - repetition penalty (llama.cpp `penalty_repeat` over the last `repeat_last_n` tokens of prompt
//!   and output, `-1` = all, `0` = off): each distinct token in the window has its logit divided by
//!   the penalty if positive, multiplied if not (CTRL, Keskar et al. 2019);
//! - presence / frequency penalties (OpenAI semantics): `logit[t] −= count[t]·frequency +
//!   (count[t] > 0)·presence` with `count` over the tokens generated so far;
//! - `temperature == 0` is greedy (argmax after penalties, lowest id on ties);
//! - top-k (`0` or `-1` = off), top-p (the smallest prefix of the probability-sorted candidates
//!   whose mass reaches `top_p`, renormalized over the candidates left by top-k, at least one kept),
//!   min-p (keeps `p ≥ min_p · p_max`) all act on temperature-1 probabilities, as in llama.cpp;
//!   the temperature then scales the kept logits before the draw.
//!
//! - prefix choices (`prefix_choices`, a list of token sequences): while set, the first generated
//!   tokens must spell one of the sequences: at each step only the tokens that continue a
//!   sequence still matching the output so far are candidates (a trie walk over the sequences;
//!   top-k, top-p and min-p then act on those candidates, renormalized over them); once the output
//!   equals a whole sequence, generation is free. The gateway uses it to let a model choose only
//!   among the offered tool names (`tool_choice: "required"`), as grammar-constrained decoding
//!   does (llama.cpp grammars, vLLM's `guided_choice`), without inventing a token itself.
//!
//! `logprob` and `top_logprobs` are the log-softmax of the model's **unmodified** logits (before
//! penalties, temperature and filters), as vLLM reports by default: they describe the model, not
//! the sampling settings.
//!
//! Determinism: one xoshiro256** generator per sequence, seeded with splitmix64(`seed`); the same
//! seed, prompt and settings give the same tokens (batching does not change the draws, because
//! each sequence draws from its own generator exactly once per token).

use std::collections::HashMap;

mod device;
pub use device::{DevicePlan, DeviceRow, DEVICE_TOP};

use crate::backend::cpu::vecops;
use crate::backend::sampling::draw_u;
use crate::backend::LogitPenalty;
use crate::{FakError, Result};

/// Largest `n_logprobs` accepted (OpenAI's `top_logprobs` bound).
pub const MAX_LOGPROBS: usize = 20;
/// Most sequences in `prefix_choices` (the gateway sends one per offered tool name and per
/// opening-brace token: 128 tools × a few hundred brace tokens fit).
pub const MAX_PREFIX_CHOICES: usize = 1 << 16;
/// Longest sequence in `prefix_choices`, in tokens.
pub const MAX_PREFIX_CHOICE_TOKENS: usize = 256;
/// Most entries in `stop_ids`.
pub const MAX_STOP_IDS: usize = 1024;

/// Sampling settings of one sequence (see the module doc for each one's semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// ≥ 0; 0 is greedy. Default 1.
    pub temperature: f32,
    /// ≥ -1; 0 and -1 disable. Default 0.
    pub top_k: i32,
    /// In [0, 1]; 1 disables. Default 1.
    pub top_p: f32,
    /// In [0, 1]; 0 disables. Default 0.
    pub min_p: f32,
    /// > 0; 1 disables. Default 1.
    pub repeat_penalty: f32,
    /// Window of the repetition penalty in tokens, ≥ -1 (-1: whole sequence, 0: off). Default 64.
    pub repeat_last_n: i32,
    /// In [-2, 2]. Default 0.
    pub presence_penalty: f32,
    /// In [-2, 2]. Default 0.
    pub frequency_penalty: f32,
    /// RNG seed; `None` draws one from the OS-seeded hasher.
    pub seed: Option<u64>,
    /// Top log-probabilities to return per token, 0..=[`MAX_LOGPROBS`]; 0 returns none.
    pub n_logprobs: usize,
    /// Token sequences the output must begin with one of (see the module doc); empty: none.
    pub prefix_choices: Vec<Vec<u32>>,
    /// Most tokens to generate, ≥ 1: the engine finishes the sequence ([`Finish::Length`]) once
    /// it has sampled this many. `None`: until the context window is full (also `Length`).
    ///
    /// [`Finish::Length`]: super::Finish::Length
    pub max_tokens: Option<usize>,
    /// Tokens that finish the sequence when sampled ([`Finish::Stop`]; the token is returned): the
    /// model's end-of-generation set, which the caller's tokenizer knows. Empty: none.
    ///
    /// [`Finish::Stop`]: super::Finish::Stop
    pub stop_ids: Vec<u32>,
    /// Speculative decoding of this sequence (draft source and length; docs/speculative.md).
    /// `None`: the engine's default.
    pub speculative: Option<crate::engine::speculative::SpecParams>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            n_logprobs: 0,
            prefix_choices: Vec::new(),
            max_tokens: None,
            stop_ids: Vec::new(),
            speculative: None,
        }
    }
}

impl SamplingParams {
    /// Checks every value's range. Errors: [`FakError::InvalidArgument`] naming the parameter.
    pub fn validate(&self) -> Result<()> {
        fn check(ok: bool, param: &str, msg: String) -> Result<()> {
            if ok {
                Ok(())
            } else {
                Err(FakError::invalid(param, msg))
            }
        }
        let t = self.temperature;
        check(
            t.is_finite() && t >= 0.0,
            "temperature",
            format!("{t} (must be a finite number ≥ 0)"),
        )?;
        check(
            self.top_k >= -1,
            "top_k",
            format!("{} (must be ≥ 0, or -1 to disable)", self.top_k),
        )?;
        let p = self.top_p;
        check(
            (0.0..=1.0).contains(&p),
            "top_p",
            format!("{p} (must be in [0, 1])"),
        )?;
        let m = self.min_p;
        check(
            (0.0..=1.0).contains(&m),
            "min_p",
            format!("{m} (must be in [0, 1])"),
        )?;
        let r = self.repeat_penalty;
        check(
            r.is_finite() && r > 0.0,
            "repeat_penalty",
            format!("{r} (must be a finite number > 0; 1 disables)"),
        )?;
        check(
            self.repeat_last_n >= -1,
            "repeat_last_n",
            format!(
                "{} (must be ≥ 0, or -1 for the whole sequence)",
                self.repeat_last_n
            ),
        )?;
        let pp = self.presence_penalty;
        check(
            (-2.0..=2.0).contains(&pp),
            "presence_penalty",
            format!("{pp} (must be in [-2, 2])"),
        )?;
        let fp = self.frequency_penalty;
        check(
            (-2.0..=2.0).contains(&fp),
            "frequency_penalty",
            format!("{fp} (must be in [-2, 2])"),
        )?;
        check(
            self.n_logprobs <= MAX_LOGPROBS,
            "n_logprobs",
            format!("{} (must be in [0, {MAX_LOGPROBS}])", self.n_logprobs),
        )?;
        check(
            self.prefix_choices.iter().all(|c| !c.is_empty()),
            "prefix_choices",
            "an empty token sequence (each choice needs at least one token)".to_string(),
        )?;
        check(
            self.prefix_choices.len() <= MAX_PREFIX_CHOICES,
            "prefix_choices",
            format!("{} sequences (at most {MAX_PREFIX_CHOICES})", self.prefix_choices.len()),
        )?;
        if let Some(c) = self.prefix_choices.iter().find(|c| c.len() > MAX_PREFIX_CHOICE_TOKENS) {
            return Err(FakError::invalid(
                "prefix_choices",
                format!("a sequence of {} tokens (each holds at most {MAX_PREFIX_CHOICE_TOKENS})", c.len()),
            ));
        }
        check(
            self.max_tokens != Some(0),
            "max_tokens",
            "0 (must be ≥ 1, or None for the rest of the context)".to_string(),
        )?;
        check(
            self.stop_ids.len() <= MAX_STOP_IDS,
            "stop_ids",
            format!("{} ids (at most {MAX_STOP_IDS})", self.stop_ids.len()),
        )?;
        Ok(())
    }

    fn has_penalties(&self) -> bool {
        (self.repeat_penalty != 1.0 && self.repeat_last_n != 0)
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// xoshiro256** (Blackman & Vigna 2018), seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// A seed from the process's randomly keyed hasher and the clock.
    pub fn entropy_seed() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The distribution a draw picks from ([`Sampler::distribution`]).
#[derive(Debug, Clone, Copy)]
enum Dist {
    /// Decided (greedy).
    Token(u32),
    /// `weights[t]` for every token `t`, with their sum.
    Whole(f64),
    /// `weights[i]` for candidate `idx[i]`, with their sum.
    Ids(f64),
}

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// log-softmax of the unmodified logits at `token`.
    pub logprob: f32,
    /// The `n_logprobs` most likely tokens under the unmodified logits, most likely first
    /// (ties: lower id first); `None` when `n_logprobs == 0`.
    pub top_logprobs: Option<Vec<(u32, f32)>>,
}

/// The sampling state of one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Occurrences of each generated token (presence / frequency penalties).
    counts: HashMap<u32, u32>,
    work: Vec<f32>,
    idx: Vec<u32>,
    weights: Vec<f32>,
    /// Walk through `params.prefix_choices`: `None` once free (or when there are none).
    choices: Option<ChoiceWalk>,
}

/// Position in the trie of `prefix_choices`: the choices that still match the output, and how
/// many tokens of them were generated.
#[derive(Debug, Clone)]
struct ChoiceWalk {
    alive: Vec<usize>,
    pos: usize,
}

impl ChoiceWalk {
    /// The tokens that continue a matching choice, ascending.
    fn next_tokens(&self, choices: &[Vec<u32>]) -> Vec<u32> {
        let mut next: Vec<u32> = self.alive.iter().map(|&i| choices[i][self.pos]).collect();
        next.sort_unstable();
        next.dedup();
        next
    }

    /// Advances past `token`; `false` when the walk is over (a choice is complete, or `token`
    /// matches none, which the sampler never produces).
    fn advance(&mut self, choices: &[Vec<u32>], token: u32) -> bool {
        let pos = self.pos;
        self.alive.retain(|&i| choices[i][pos] == token);
        self.pos += 1;
        !self.alive.is_empty() && self.alive.iter().all(|&i| choices[i].len() > self.pos)
    }
}

impl Sampler {
    /// A sampler for `params` (validated). Errors: [`FakError::InvalidArgument`].
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let rng = Rng::new(params.seed.unwrap_or_else(Rng::entropy_seed));
        let choices = (!params.prefix_choices.is_empty()).then(|| ChoiceWalk {
            alive: (0..params.prefix_choices.len()).collect(),
            pos: 0,
        });
        Ok(Sampler {
            params,
            rng,
            counts: HashMap::new(),
            work: Vec::new(),
            idx: Vec::new(),
            weights: Vec::new(),
            choices,
        })
    }

    /// The settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a generated token (presence / frequency penalties count generated tokens only).
    pub fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
        if let Some(walk) = &mut self.choices {
            if !walk.advance(&self.params.prefix_choices, token) {
                self.choices = None;
            }
        }
    }

    /// The tokens the next draw may pick under `prefix_choices` (ascending), or `None` when
    /// generation is free.
    pub fn allowed_tokens(&self) -> Option<Vec<u32>> {
        self.choices
            .as_ref()
            .map(|w| w.next_tokens(&self.params.prefix_choices))
    }

    /// Picks the next token from `logits` (`[n_vocab]`, unmodified model output). `history` is
    /// the sequence so far (prompt and generated tokens), for the repetition penalty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Sampled {
        let token = self.choose(logits, history);
        self.report(logits, token)
    }

    /// `token` with its log-probability (and the top ones) under the unmodified `logits`.
    fn report(&self, logits: &[f32], token: u32) -> Sampled {
        let (max, ln_z) = log_normalizer(logits);
        let logprob = (logits[token as usize] - max) - ln_z;
        let top_logprobs = (self.params.n_logprobs > 0).then(|| {
            top_n(logits, self.params.n_logprobs)
                .into_iter()
                .map(|t| (t, (logits[t as usize] - max) - ln_z))
                .collect()
        });
        Sampled {
            token,
            logprob,
            top_logprobs,
        }
    }

    /// Whether the next token is the plain argmax with nothing else to report (temperature 0, no
    /// penalty, no top log-probabilities): the engine then takes the backend's greedy fast path.
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature <= 0.0 && !p.has_penalties() && p.n_logprobs == 0 && self.choices.is_none()
    }

    fn choose(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let d = self.distribution(logits, history);
        self.draw_dist(d)
    }

    /// The distribution of the next token (see the module doc for the chain): a token (greedy),
    /// or weights in `self.weights` over the whole vocabulary or over the candidates
    /// `self.idx[..weights.len()]`, with their sum.
    fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Dist {
        let allowed = self.allowed_tokens().and_then(|mut a| {
            a.retain(|&t| (t as usize) < logits.len()); // ids are checked by the engine
            (!a.is_empty()).then_some(a)
        });
        let p = &self.params;
        let l: &[f32] = if p.has_penalties() {
            self.work.clear();
            self.work.extend_from_slice(logits);
            apply_penalties(&mut self.work, p, history, &self.counts);
            &self.work
        } else {
            logits
        };
        let by_logit = |a: &u32, b: &u32| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b));
        if let Some(allowed) = &allowed {
            if p.temperature <= 0.0 {
                // argmax over the allowed tokens (lowest id on ties, as `argmax`)
                return Dist::Token(*allowed
                    .iter()
                    .min_by(|a, b| by_logit(a, b))
                    .expect("a walk has a next token"));
            }
        }
        if p.temperature <= 0.0 {
            return Dist::Token(crate::backend::cpu::argmax(l) as u32);
        }
        let n = l.len();
        let top_k = if p.top_k > 0 && (p.top_k as usize) < n {
            p.top_k as usize
        } else {
            0
        };
        let filtered = top_k > 0 || p.top_p < 1.0 || p.min_p > 0.0;
        if allowed.is_none() && !filtered {
            // Draw from the whole vocabulary.
            let max = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            self.weights.resize(n, 0.0);
            let total =
                vecops::exp_scaled_sum(l, max, 1.0 / p.temperature, Some(&mut self.weights));
            return Dist::Whole(total);
        }

        // Candidates sorted by logit, descending (ties: lower id first).
        let idx = &mut self.idx;
        if let Some(allowed) = allowed {
            // only the tokens that continue a prefix choice; top-k among them
            idx.clear();
            idx.extend(allowed);
            idx.sort_unstable_by(by_logit);
            if top_k > 0 {
                idx.truncate(top_k);
            }
        } else if top_k > 0 {
            top_k_sorted(l, top_k, idx);
        } else if p.top_p < 1.0 {
            // Sort progressively larger prefixes until the nucleus is inside one.
            let max = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let z = vecops::exp_scaled_sum(l, max, 1.0, None);
            let mut m = 64.min(n);
            loop {
                top_k_sorted(l, m, idx);
                match nucleus_cut(idx.iter().map(|&t| l[t as usize]), max, z, p.top_p) {
                    Some(c) => {
                        idx.truncate(c);
                        break;
                    }
                    None if m == n => break,
                    None => m = (m * 8).min(n),
                }
            }
        } else {
            // min-p only: keep the tokens above the threshold, then sort them.
            let max = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let min_logit = max + p.min_p.ln();
            idx.clear();
            idx.extend((0..n as u32).filter(|&t| l[t as usize] >= min_logit));
            idx.sort_unstable_by(by_logit);
        }
        let renorm = (top_k > 0 || self.choices.is_some()) && p.top_p < 1.0;
        let vals: Vec<f32> = self.idx.iter().map(|&t| l[t as usize]).collect();
        Dist::Ids(self.sorted_weights(&vals, renorm))
    }

    /// Draws from a [`Dist`] (`self.weights`, and `self.idx` for [`Dist::Ids`]).
    fn draw_dist(&mut self, d: Dist) -> u32 {
        match d {
            Dist::Token(t) => t,
            Dist::Whole(total) => draw(&mut self.rng, &self.weights, total, |i| i as u32),
            Dist::Ids(total) => {
                let idx = &self.idx;
                draw(&mut self.rng, &self.weights, total, |i| idx[i])
            }
        }
    }

    /// Verifies draft token `draft` against the distribution of the next token given `logits`
    /// and `history` (as [`Self::sample`]): greedy (temperature 0), the target's choice (the
    /// caller accepts `draft` when it is that); sampled, the rejection rule of speculative
    /// sampling for a deterministic draft (Leviathan et al. 2023, Chen et al. 2023 with
    /// `q = one-hot(draft)`): `draft` with probability `p(draft)` (one uniform of the sequence's
    /// generator), else a draw from the residual `max(0, p − q)` normalized, `p` without `draft`
    /// (a second uniform). The token returned is distributed as `p` whatever the draft.
    pub fn verify(&mut self, logits: &[f32], history: &[u32], draft: u32) -> Sampled {
        let token = if self.params.temperature <= 0.0 {
            self.choose(logits, history)
        } else {
            let d = self.distribution(logits, history);
            let (pos, total) = match d {
                Dist::Token(_) => (None, 0.0), // not produced at temperature > 0
                Dist::Whole(total) => (((draft as usize) < self.weights.len()).then_some(draft as usize), total),
                Dist::Ids(total) => (self.idx[..self.weights.len()].iter().position(|&t| t == draft), total),
            };
            if let Dist::Token(t) = d {
                t
            } else {
                let w = pos.map_or(0.0, |i| self.weights[i] as f64);
                let u = self.rng.next_f64();
                if w > 0.0 && u * total < w {
                    draft
                } else if total - w <= 0.0 {
                    draft // every candidate is the draft's (p(draft) = 1 up to rounding)
                } else {
                    if let Some(i) = pos {
                        self.weights[i] = 0.0;
                    }
                    self.draw_dist(match d {
                        Dist::Whole(_) => Dist::Whole(total - w),
                        _ => Dist::Ids(total - w),
                    })
                }
            }
        };
        self.report(logits, token)
    }

    /// The end of every filtered draw, over candidates `ids` sorted by logit (descending, ties
    /// lower id first) with logits `vals`: top-p renormalized over them (when `renorm_top_p`:
    /// after top-k or prefix choices), min-p relative to the first, then the temperature softmax
    /// and the draw.
    fn finish_sorted(&mut self, ids: &[u32], vals: &[f32], renorm_top_p: bool) -> u32 {
        let total = self.sorted_weights(vals, renorm_top_p);
        draw(&mut self.rng, &self.weights, total, |i| ids[i])
    }

    /// [`Self::finish_sorted`] short of the draw: fills `self.weights` with the weights of the
    /// first candidates kept (of `vals`, sorted descending) and returns their sum.
    fn sorted_weights(&mut self, vals: &[f32], renorm_top_p: bool) -> f64 {
        let p = &self.params;
        let mut keep = vals.len();
        if renorm_top_p {
            // top-p over the top-k (or allowed) candidates (renormalized over them).
            let max = vals[0];
            let z: f64 = vals.iter().map(|&v| ((v - max) as f64).exp()).sum();
            keep = nucleus_cut(vals.iter().copied(), max, z, p.top_p).unwrap_or(keep).max(1);
        }
        if p.min_p > 0.0 && keep > 0 {
            let min_logit = vals[0] + p.min_p.ln();
            keep = vals[..keep].iter().take_while(|&&v| v >= min_logit).count().max(1);
        }
        // Temperature, softmax over the candidates, draw.
        let max = vals[0];
        let inv_t = 1.0 / p.temperature;
        self.weights.clear();
        self.weights.extend(vals[..keep].iter().map(|&v| ((v - max) * inv_t).exp()));
        self.weights.iter().map(|&w| w as f64).sum()
    }
}

/// How many of the candidates (sorted descending, logits `vals`) the nucleus keeps: the first
/// count whose mass `Σ e^(v − max) / z` reaches `top_p`; `None` when they all fall short.
fn nucleus_cut(vals: impl IntoIterator<Item = f32>, max: f32, z: f64, top_p: f32) -> Option<usize> {
    let mut cum = 0f64;
    for (i, v) in vals.into_iter().enumerate() {
        cum += ((v - max) as f64).exp() / z;
        if cum >= top_p as f64 {
            return Some(i + 1);
        }
    }
    None
}

/// The penalties of one sequence as a list of `(token, repeat, delta)`, one entry per distinct
/// token: the logit `v` of `token` becomes `(v ≤ 0 ? v·repeat : v/repeat) − delta`
/// ([`LogitPenalty::apply`]): the repetition penalty over the window of `history`, then the
/// presence/frequency penalties over `counts` of generated tokens (`repeat` 1 and `delta` 0 where
/// one does not apply, which leave `v` unchanged bit for bit). Ascending by token.
pub fn penalty_entries(
    p: &SamplingParams,
    history: &[u32],
    counts: &HashMap<u32, u32>,
) -> Vec<(u32, f32, f32)> {
    let mut e: Vec<(u32, f32, f32)> = Vec::new();
    if p.repeat_penalty != 1.0 && p.repeat_last_n != 0 {
        let n = if p.repeat_last_n < 0 {
            history.len()
        } else {
            (p.repeat_last_n as usize).min(history.len())
        };
        e.extend(history[history.len() - n..].iter().map(|&t| (t, p.repeat_penalty, 0.0)));
        e.sort_unstable_by_key(|x| x.0);
        e.dedup_by_key(|x| x.0);
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        for (&t, &c) in counts {
            let delta = c as f32 * p.frequency_penalty + if c > 0 { p.presence_penalty } else { 0.0 };
            match e.binary_search_by_key(&t, |x| x.0) {
                Ok(i) => e[i].2 = delta,
                Err(i) => e.insert(i, (t, 1.0, delta)),
            }
        }
    }
    e
}

/// Applies the penalties ([`penalty_entries`]) to `l` in place.
pub fn apply_penalties(
    l: &mut [f32],
    p: &SamplingParams,
    history: &[u32],
    counts: &HashMap<u32, u32>,
) {
    for (token, repeat, delta) in penalty_entries(p, history, counts) {
        if let Some(v) = l.get_mut(token as usize) {
            *v = LogitPenalty { row: 0, token, repeat, delta }.apply(*v);
        }
    }
}

/// `(max, ln Σ e^(l − max))` of `l`: the log-softmax of token `t` is `(l[t] − max) − ln_z`
/// (the same expression as [`crate::backend::greedy_row`], so both paths give identical bits).
pub fn log_normalizer(l: &[f32]) -> (f32, f32) {
    let max = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let z = vecops::exp_scaled_sum(l, max, 1.0, None);
    (max, z.ln() as f32)
}

/// The `n` largest entries of `l` (ties: lower index first), largest first.
pub fn top_n(l: &[f32], n: usize) -> Vec<u32> {
    if n == 0 {
        return Vec::new();
    }
    let mut best: Vec<u32> = Vec::with_capacity(n + 1);
    for (i, &v) in l.iter().enumerate() {
        if v.is_nan() || (best.len() == n && v <= l[*best.last().expect("n > 0") as usize]) {
            continue;
        }
        let pos = best.partition_point(|&b| l[b as usize] >= v);
        best.insert(pos, i as u32);
        best.truncate(n);
    }
    best
}

/// Fills `idx` with the `k` largest indices of `l`, sorted descending (ties: lower id first).
fn top_k_sorted(l: &[f32], k: usize, idx: &mut Vec<u32>) {
    let by_logit = |a: &u32, b: &u32| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b));
    idx.clear();
    idx.extend(0..l.len() as u32);
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_logit);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_logit);
}

/// Draws index `i` with probability `w[i] / total`, mapped through `id` ([`draw_u`] with the
/// generator's next uniform).
fn draw(rng: &mut Rng, w: &[f32], total: f64, id: impl Fn(usize) -> u32) -> u32 {
    draw_u(rng.next_f64(), w, total, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        // A peaked distribution over 1000 tokens with a clear order.
        (0..1000)
            .map(|i| -((i as f32 - 500.0) / 40.0).powi(2) + ((i * 7919) % 13) as f32 * 0.01)
            .collect()
    }

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            seed: Some(42),
            ..Default::default()
        };
        f(&mut p);
        p
    }

    fn run(p: SamplingParams, l: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p).unwrap();
        let mut hist = vec![1u32, 2, 3];
        (0..n)
            .map(|_| {
                let t = s.sample(l, &hist).token;
                s.accept(t);
                hist.push(t);
                t
            })
            .collect()
    }

    #[test]
    fn greedy_is_argmax() {
        let l = logits();
        let want = crate::backend::cpu::argmax(&l) as u32;
        assert_eq!(run(params(|p| p.temperature = 0.0), &l, 5), vec![want; 5]);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let l = logits();
        let a = run(params(|_| {}), &l, 64);
        let b = run(params(|_| {}), &l, 64);
        let c = run(params(|p| p.seed = Some(43)), &l, 64);
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The draws follow the distribution: tokens near the mode.
        assert!(a.iter().all(|&t| (400..600).contains(&t)), "{a:?}");
    }

    #[test]
    fn top_k_limits_candidates() {
        let l = logits();
        let mut order: Vec<u32> = (0..l.len() as u32).collect();
        order.sort_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]));
        let allowed = &order[..3];
        let toks = run(
            params(|p| {
                p.top_k = 3;
                p.temperature = 5.0
            }),
            &l,
            200,
        );
        assert!(toks.iter().all(|t| allowed.contains(t)));
        let mut distinct = toks.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            3,
            "high temperature over 3 candidates visits all of them"
        );
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.8 keeps the first two exactly.
        let l: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let toks = run(params(|p| p.top_p = 0.8), &l, 300);
        assert!(toks.iter().all(|&t| t < 2));
        assert!(toks.contains(&0) && toks.contains(&1));
        // 0.81 needs the third token too.
        let toks = run(params(|p| p.top_p = 0.81), &l, 300);
        assert!(toks.iter().all(|&t| t < 3) && toks.contains(&2));
        // top_p = 0 keeps only the most likely token.
        assert!(run(params(|p| p.top_p = 0.0), &l, 50)
            .iter()
            .all(|&t| t == 0));
        // The nucleus search over a large vocabulary (progressive sort) agrees.
        let big = logits();
        let mut order: Vec<u32> = (0..big.len() as u32).collect();
        order.sort_by(|a, b| big[*b as usize].total_cmp(&big[*a as usize]));
        let (max, ln_z) = log_normalizer(&big);
        let mut cum = 0.0;
        let mut nucleus = 0;
        for &t in &order {
            cum += ((big[t as usize] - max - ln_z) as f64).exp();
            nucleus += 1;
            if cum >= 0.9 {
                break;
            }
        }
        assert!(
            nucleus > 64,
            "test needs a nucleus larger than the first sort"
        );
        let toks = run(params(|p| p.top_p = 0.9), &big, 500);
        assert!(toks.iter().all(|t| order[..nucleus].contains(t)));
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let l: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        // p ≥ 0.35 · 0.5 = 0.175 keeps tokens 0 and 1.
        let toks = run(params(|p| p.min_p = 0.35), &l, 300);
        assert!(toks.iter().all(|&t| t < 2) && toks.contains(&1));
        let toks = run(params(|p| p.min_p = 0.25), &l, 300);
        assert!(toks.iter().all(|&t| t < 3) && toks.contains(&2));
    }

    #[test]
    fn repetition_penalty_llama_cpp_semantics() {
        let p = params(|p| {
            p.repeat_penalty = 2.0;
            p.repeat_last_n = 2
        });
        let mut l = vec![4.0f32, -4.0, 4.0, -4.0, 1.0];
        // Window = the last two tokens [1, 3]; the older 0 is outside it.
        apply_penalties(&mut l, &p, &[0, 1, 3], &HashMap::new());
        assert_eq!(l, vec![4.0, -8.0, 4.0, -8.0, 1.0]);
        let mut l = vec![4.0f32, -4.0, 4.0];
        let p = params(|p| {
            p.repeat_penalty = 2.0;
            p.repeat_last_n = -1
        });
        apply_penalties(&mut l, &p, &[0, 0, 0, 1], &HashMap::new());
        assert_eq!(
            l,
            vec![2.0, -8.0, 4.0],
            "each distinct token penalized once"
        );
    }

    #[test]
    fn presence_and_frequency_openai_semantics() {
        let p = params(|p| {
            p.presence_penalty = 0.5;
            p.frequency_penalty = 0.25
        });
        let counts = HashMap::from([(0u32, 3u32), (2, 1)]);
        let mut l = vec![1.0f32, 1.0, 1.0];
        apply_penalties(&mut l, &p, &[], &counts);
        assert_eq!(l, vec![1.0 - 0.75 - 0.5, 1.0, 1.0 - 0.25 - 0.5]);
        // Greedy with a strong presence penalty never repeats a token.
        let flat = vec![0.0f32; 10];
        let toks = run(
            params(|p| {
                p.temperature = 0.0;
                p.presence_penalty = 2.0
            }),
            &flat,
            10,
        );
        let mut d = toks.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), 10, "{toks:?}");
    }

    #[test]
    fn logprobs_of_unmodified_logits() {
        let l = vec![2.0f32, 1.0, 0.5, 2.0];
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.n_logprobs = 3;
            p.presence_penalty = 2.0
        }))
        .unwrap();
        let lse = (l.iter().map(|&x| (x as f64).exp()).sum::<f64>()).ln() as f32;
        let out = s.sample(&l, &[]);
        assert_eq!(out.token, 0);
        assert!((out.logprob - (2.0 - lse)).abs() < 1e-5);
        let top = out.top_logprobs.unwrap();
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 3, 1]);
        assert!((top[2].1 - (1.0 - lse)).abs() < 1e-5);
        s.accept(0);
        // Penalties change the choice, never the reported logprobs.
        let out2 = s.sample(&l, &[0]);
        assert_eq!(out2.token, 3);
        assert!((out2.logprob - (2.0 - lse)).abs() < 1e-5);
        assert!(Sampler::new(params(|p| p.n_logprobs = 0))
            .unwrap()
            .sample(&l, &[])
            .top_logprobs
            .is_none());
    }

    #[test]
    fn greedy_fast_path_matches_sampler_bits() {
        let l = logits();
        let mut s = Sampler::new(params(|p| p.temperature = 0.0)).unwrap();
        assert!(s.is_plain_greedy());
        let out = s.sample(&l, &[]);
        assert_eq!(crate::backend::greedy_row(&l), (out.token, out.logprob));
        assert!(!Sampler::new(params(|p| p.temperature = 0.0 + 0.5))
            .unwrap()
            .is_plain_greedy());
        assert!(!Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.n_logprobs = 1
        }))
        .unwrap()
        .is_plain_greedy());
    }

    #[test]
    fn invalid_values_name_the_parameter() {
        let cases: Vec<(SamplingParams, &str)> = vec![
            (params(|p| p.temperature = -0.1), "temperature"),
            (params(|p| p.temperature = f32::NAN), "temperature"),
            (params(|p| p.top_k = -2), "top_k"),
            (params(|p| p.top_p = 1.5), "top_p"),
            (params(|p| p.min_p = -0.1), "min_p"),
            (params(|p| p.repeat_penalty = 0.0), "repeat_penalty"),
            (params(|p| p.repeat_last_n = -5), "repeat_last_n"),
            (params(|p| p.presence_penalty = 2.5), "presence_penalty"),
            (params(|p| p.frequency_penalty = -3.0), "frequency_penalty"),
            (params(|p| p.n_logprobs = 21), "n_logprobs"),
        ];
        for (p, name) in cases {
            match Sampler::new(p) {
                Err(FakError::InvalidArgument { param, .. }) => assert_eq!(param, name),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn prefix_choices_walk_the_trie_then_free() {
        // Choices [5, 6], [5, 7, 8] and [9]: the first token is 5 or 9 whatever the logits say.
        let choices = vec![vec![5u32, 6], vec![5, 7, 8], vec![9]];
        let mut l = vec![0.0f32; 16];
        l[3] = 10.0; // the unconstrained argmax, never allowed while the walk runs
        l[9] = 1.0;
        l[5] = 2.0;
        l[7] = 0.5;
        l[6] = 0.25;
        let greedy = params(|p| {
            p.temperature = 0.0;
            p.prefix_choices = choices.clone();
        });
        let mut s = Sampler::new(greedy.clone()).unwrap();
        assert!(!s.is_plain_greedy(), "a walk needs the host sampler");
        assert_eq!(s.allowed_tokens(), Some(vec![5, 9]));
        let t = s.sample(&l, &[]).token;
        assert_eq!(t, 5);
        s.accept(t);
        assert_eq!(s.allowed_tokens(), Some(vec![6, 7]));
        let t = s.sample(&l, &[]).token;
        assert_eq!(t, 7, "7 (0.5) beats 6 (0.25)");
        s.accept(t);
        assert_eq!(s.allowed_tokens(), Some(vec![8]));
        let t = s.sample(&l, &[]).token;
        assert_eq!(t, 8);
        s.accept(t);
        assert_eq!(
            s.allowed_tokens(),
            None,
            "the choice [5, 7, 8] is complete: free"
        );
        assert!(s.is_plain_greedy());
        assert_eq!(s.sample(&l, &[]).token, 3);
        // Logprobs stay those of the unmodified logits.
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.n_logprobs = 1;
            p.prefix_choices = choices.clone();
        }))
        .unwrap();
        let out = s.sample(&l, &[]);
        assert_eq!(out.token, 5);
        assert_eq!(out.top_logprobs.unwrap()[0].0, 3);
        // Sampling at a high temperature with top-k and top-p still draws only allowed tokens,
        // and visits both first tokens.
        let mut firsts = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let mut s = Sampler::new(params(|p| {
                p.seed = Some(seed);
                p.temperature = 3.0;
                p.top_k = 40;
                p.top_p = 0.99;
                p.prefix_choices = choices.clone();
            }))
            .unwrap();
            let mut out = Vec::new();
            while let Some(allowed) = s.allowed_tokens() {
                let t = s.sample(&l, &out).token;
                assert!(allowed.contains(&t), "{t} not in {allowed:?}");
                s.accept(t);
                out.push(t);
            }
            assert!(choices.contains(&out), "{out:?} is not a choice");
            firsts.insert(out[0]);
        }
        assert_eq!(firsts.into_iter().collect::<Vec<_>>(), vec![5, 9]);
        // An empty choice is refused, naming the parameter.
        match Sampler::new(params(|p| p.prefix_choices = vec![vec![1], vec![]])) {
            Err(FakError::InvalidArgument { param, .. }) => assert_eq!(param, "prefix_choices"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn top_n_order_and_ties() {
        assert_eq!(top_n(&[1.0, 3.0, 3.0, 2.0, 5.0], 3), vec![4, 1, 2]);
        assert_eq!(top_n(&[1.0, 2.0], 5), vec![1, 0]);
    }

    /// Speculative sampling's rejection rule leaves the distribution of the token unchanged: over
    /// many draws with a fixed draft (in, or outside, the candidates), token frequencies match
    /// the target distribution (chi-square, 7 degrees of freedom, p = 1e-4: 29.88), and greedy
    /// verification is the target's argmax.
    #[test]
    fn verify_keeps_the_target_distribution() {
        let l: Vec<f32> = vec![1.0, 2.2, 0.3, 1.9, -0.5, 0.8, 1.5, 0.0];
        let softmax = |l: &[f32], t: f32, keep: &[usize]| -> Vec<f64> {
            let w: Vec<f64> = (0..l.len()).map(|i| if keep.contains(&i) { ((l[i] / t) as f64).exp() } else { 0.0 }).collect();
            let z: f64 = w.iter().sum();
            w.iter().map(|x| x / z).collect()
        };
        let all: Vec<usize> = (0..8).collect();
        let cases: Vec<(SamplingParams, u32, Vec<f64>)> = vec![
            (params(|p| p.temperature = 0.7), 3, softmax(&l, 0.7, &all)),
            (params(|p| p.temperature = 1.3), 4, softmax(&l, 1.3, &all)),
            (params(|p| { p.temperature = 1.0; p.top_k = 3 }), 6, softmax(&l, 1.0, &[1, 3, 6])),
            (params(|p| { p.temperature = 1.0; p.top_k = 3 }), 0, softmax(&l, 1.0, &[1, 3, 6])),
        ];
        for (p, draft, want) in cases {
            let mut s = Sampler::new(p.clone()).unwrap();
            let n = 100_000;
            let mut counts = [0usize; 8];
            let mut kept = 0;
            for _ in 0..n {
                let t = s.verify(&l, &[], draft).token;
                counts[t as usize] += 1;
                kept += (t == draft) as usize;
            }
            let chi2: f64 = (0..8)
                .filter(|&i| want[i] > 0.0)
                .map(|i| {
                    let e = want[i] * n as f64;
                    (counts[i] as f64 - e).powi(2) / e
                })
                .sum();
            assert!(chi2 < 29.88, "{p:?} draft {draft}: chi2 {chi2}, counts {counts:?}, want {want:?}");
            for i in 0..8 {
                if want[i] == 0.0 {
                    assert_eq!(counts[i], 0, "token {i} outside the candidates");
                }
            }
            assert_eq!(kept, counts[draft as usize]);
        }
        // greedy: the argmax, whatever the draft
        let mut s = Sampler::new(params(|p| p.temperature = 0.0)).unwrap();
        assert_eq!(s.verify(&l, &[], 3).token, 1);
        assert_eq!(s.verify(&l, &[], 1).token, 1);
        // the same seed and draft give the same tokens
        let mut a = Sampler::new(params(|p| p.temperature = 0.9)).unwrap();
        let mut b = Sampler::new(params(|p| p.temperature = 0.9)).unwrap();
        for _ in 0..100 {
            assert_eq!(a.verify(&l, &[], 3), b.verify(&l, &[], 3));
        }
    }
}
