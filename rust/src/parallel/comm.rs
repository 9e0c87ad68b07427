//! Collectives between tensor-parallel shards: the [`Communicator`] trait (one object per rank,
//! as an NCCL `ncclComm_t`), and [`LocalComm`], its in-process implementation for shards that
//! run on threads of one process over the CPU backend.
//!
//! The forward needs two collectives ([`super`]):
//!
//! - `all_reduce_sum` after `attn_output` and after `ffn_down` of every layer: every rank's
//!   partial `[n_rows, n_embd]` projection is replaced by the sum over ranks;
//! - `gather_cols` once, after the LM head: rank 0 receives every rank's vocabulary slice of the
//!   logits side by side (`[n_rows, n_vocab]`).
//!
//! **Summation order** ([`LocalComm`]): element `i` of the all-reduce is
//! `((p_0[i] + p_1[i]) + p_2[i]) + … + p_{N−1}[i]`, in f32, ranks in ascending order, on every
//! rank. The result is therefore the same bits on every rank (each shard's residual stream stays
//! identical to the others', which the replicated RMSNorm and the next layer's column split rely
//! on) and the same bits from run to run, whatever the thread timing. It differs from the
//! unsharded forward only in where the K sum of `attn_output`/`ffn_down` is split: each shard's
//! partial dot product is rounded to f32 before the sum (docs/tensor-parallel.md measures the
//! effect on the logits).
//!
//! **An NCCL implementation** (not built: no multi-GPU machine to run it on) would hold one
//! `ncclComm_t` per rank, created once per engine (`ncclGetUniqueId` + `ncclCommInitRank` on one
//! thread per GPU, or `ncclCommInitAll`), and issue `ncclAllReduce(buf, buf, n, ncclFloat32,
//! ncclSum, comm, stream)` on the engine's stream (so it is captured in the decode CUDA graph),
//! and `ncclAllGather` (or `ncclSend`/`ncclRecv` to rank 0) for the logits, through cudarc's
//! `nccl` feature. NCCL's ring/tree reductions use another order than this one, but also give
//! every rank the same bits. `NCCL_NVLS_ENABLE=0` must be set on the GPU machines here (no
//! NVLink multicast). `abort`/`recover` map to `ncclCommAbort` and a new communicator.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Instant;

use rayon::prelude::*;

use crate::backend::cpu::{CpuBackend, CpuBuffer};
use crate::backend::Backend;
use crate::{FakError, Result};

/// One rank's end of a group of `size()` tensor-parallel shards. Every rank must make the same
/// sequence of collective calls with the same `n`/`n_rows`; a call returns when this rank's part
/// is done (its result is then in `buf`/`out`).
pub trait Communicator<B: Backend>: Send + Sync {
    /// This rank (`0 ≤ rank < size`).
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn size(&self) -> usize;

    /// `buf[..n] ← Σ_r buf_r[..n]` over all ranks (f32), the same bits on every rank.
    ///
    /// Errors: [`FakError::Backend`] when the group was aborted (another rank failed).
    fn all_reduce_sum(&self, be: &B, buf: &mut B::Buffer, n: usize) -> Result<()>;

    /// Rank `r` holds `part_r = [n_rows, n_cols_r]` (row-major); rank 0, which passes `out`,
    /// receives `out[row, c_r + j] = part_r[row, j]` with `c_r = Σ_{s<r} n_cols_s` and
    /// `Σ_r n_cols_r` columns per row. Other ranks pass `None`.
    ///
    /// Errors: as [`Communicator::all_reduce_sum`]; [`FakError::InvalidArgument`] when `out` is
    /// given on a rank other than 0.
    fn gather_cols(&self, be: &B, part: &B::Buffer, n_rows: usize, n_cols: usize, out: Option<&mut B::Buffer>) -> Result<()>;

    /// Wakes every rank waiting in a collective with an error, and fails every later one until
    /// [`Communicator::recover`]: a rank that fails between collectives calls this so that the
    /// others do not wait for it forever.
    fn abort(&self);

    /// Brings the group back to its initial state after an abort. Called once every rank has
    /// returned from the failed forward (no rank is inside a collective).
    fn recover(&self);

    /// Seconds this rank spent in collectives since creation: `(total, waiting)`, where
    /// `waiting` is the part spent at a barrier for the other ranks to arrive (their imbalance,
    /// not data movement).
    fn seconds(&self) -> (f64, f64);
}

/// A barrier that can be aborted: `wait` returns an error instead of blocking forever when a
/// rank gives up.
struct Barrier {
    n: usize,
    state: Mutex<BarrierState>,
    cv: Condvar,
}

struct BarrierState {
    arrived: usize,
    generation: u64,
    aborted: bool,
}

fn aborted() -> FakError {
    FakError::Backend { backend: "tensor-parallel".into(), msg: "the shard group was aborted: another shard failed".into() }
}

impl Barrier {
    fn wait(&self) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.aborted {
            return Err(aborted());
        }
        let gen = st.generation;
        st.arrived += 1;
        if st.arrived == self.n {
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while st.generation == gen && !st.aborted {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.generation == gen {
            Err(aborted())
        } else {
            Ok(())
        }
    }

    fn abort(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).aborted = true;
        self.cv.notify_all();
    }

    fn reset(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.arrived = 0;
        st.aborted = false;
        st.generation += 1;
    }
}

/// What a rank publishes for one collective: its data and, for a gather, its column count.
#[derive(Default)]
struct Slot {
    data: Vec<f32>,
    n_cols: usize,
}

struct Shared {
    n: usize,
    /// Two sets of slots, used by alternate collectives (`[parity][rank]`): a rank writes set
    /// `k mod 2` in its `k`-th collective. Another rank may still be reading collective `k − 1`'s
    /// set (the other one), but no longer collective `k − 2`'s: this rank got past collective
    /// `k − 1`'s barrier, which every rank reaches only after its reads of collective `k − 2`.
    /// So one barrier per collective suffices (a single set would need a second barrier after
    /// the reads).
    slots: [Vec<RwLock<Slot>>; 2],
    barrier: Barrier,
}

/// One rank of an in-process group (shards on threads of this process, CPU backend). Made by
/// [`LocalComm::group`]. See the module doc for the summation order.
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Collectives this rank has entered (selects the slot set).
    calls: AtomicUsize,
    total_ns: AtomicU64,
    wait_ns: AtomicU64,
}

/// Elements from which a reduction or copy is spread over the rank's rayon pool.
const PAR_MIN: usize = 1 << 15;

impl LocalComm {
    /// The `n` ranks of a new group, in rank order.
    ///
    /// Errors: [`FakError::InvalidArgument`] (`tensor_parallel`) for `n = 0`.
    pub fn group(n: usize) -> Result<Vec<LocalComm>> {
        if n == 0 {
            return Err(FakError::invalid("tensor_parallel", "0 (must be ≥ 1)"));
        }
        let slots = || (0..n).map(|_| RwLock::new(Slot::default())).collect();
        let shared = Arc::new(Shared {
            n,
            slots: [slots(), slots()],
            barrier: Barrier { n, state: Mutex::new(BarrierState { arrived: 0, generation: 0, aborted: false }), cv: Condvar::new() },
        });
        Ok((0..n)
            .map(|rank| LocalComm { rank, shared: shared.clone(), calls: AtomicUsize::new(0), total_ns: AtomicU64::new(0), wait_ns: AtomicU64::new(0) })
            .collect())
    }

    fn slots(&self) -> &[RwLock<Slot>] {
        &self.shared.slots[self.calls.fetch_add(1, Ordering::Relaxed) % 2]
    }

    fn publish(&self, slots: &[RwLock<Slot>], data: &[f32], n_cols: usize) {
        let mut s = slots[self.rank].write().unwrap_or_else(|e| e.into_inner());
        s.data.clear();
        s.data.extend_from_slice(data);
        s.n_cols = n_cols;
    }

    fn barrier(&self) -> Result<()> {
        let t = Instant::now();
        let r = self.shared.barrier.wait();
        self.wait_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    fn timed<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f();
        self.total_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// The all-reduce on a plain slice (what [`Communicator::all_reduce_sum`] runs on a
    /// [`CpuBuffer`]'s elements).
    pub fn all_reduce_slice(&self, buf: &mut [f32]) -> Result<()> {
        self.timed(|| {
            let slots = self.slots();
            self.publish(slots, buf, 0);
            self.barrier()?;
            let parts: Vec<_> = slots.iter().map(|s| s.read().unwrap_or_else(|e| e.into_inner())).collect();
            let n = buf.len();
            if parts.iter().any(|p| p.data.len() != n) {
                return Err(FakError::invalid("n", "ranks passed all-reduces of different lengths"));
            }
            // Rank order, on every rank: ((p0 + p1) + p2) + ...
            let sum = |(i0, out): (usize, &mut [f32])| {
                let len = out.len();
                out.copy_from_slice(&parts[0].data[i0..i0 + len]);
                for p in &parts[1..] {
                    for (o, &v) in out.iter_mut().zip(&p.data[i0..i0 + len]) {
                        *o += v;
                    }
                }
            };
            if n >= PAR_MIN {
                buf.par_chunks_mut(PAR_MIN / 4).enumerate().for_each(|(c, out)| sum((c * (PAR_MIN / 4), out)));
            } else {
                sum((0, buf));
            }
            Ok(())
        })
    }

    /// The gather on plain slices (see [`Communicator::gather_cols`]).
    pub fn gather_cols_slice(&self, part: &[f32], n_rows: usize, n_cols: usize, out: Option<&mut [f32]>) -> Result<()> {
        self.timed(|| {
            if out.is_some() && self.rank != 0 {
                return Err(FakError::invalid("out", "only rank 0 receives the gathered columns"));
            }
            let slots = self.slots();
            self.publish(slots, &part[..n_rows * n_cols], n_cols);
            self.barrier()?;
            let Some(out) = out else { return Ok(()) };
            let parts: Vec<_> = slots.iter().map(|s| s.read().unwrap_or_else(|e| e.into_inner())).collect();
            let total: usize = parts.iter().map(|p| p.n_cols).sum();
            if parts.iter().any(|p| p.data.len() != n_rows * p.n_cols) || out.len() < n_rows * total {
                return Err(FakError::invalid("n_rows", "ranks passed gathers of different row counts, or the output is too small"));
            }
            let copy_row = |(row, o): (usize, &mut [f32])| {
                let mut c0 = 0;
                for p in &parts {
                    o[c0..c0 + p.n_cols].copy_from_slice(&p.data[row * p.n_cols..(row + 1) * p.n_cols]);
                    c0 += p.n_cols;
                }
            };
            let out = &mut out[..n_rows * total];
            if n_rows * total >= PAR_MIN && n_rows > 1 {
                out.par_chunks_mut(total).enumerate().for_each(copy_row);
            } else {
                out.chunks_mut(total).enumerate().for_each(copy_row);
            }
            Ok(())
        })
    }
}

impl Communicator<CpuBackend> for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.n
    }

    fn all_reduce_sum(&self, _be: &CpuBackend, buf: &mut CpuBuffer, n: usize) -> Result<()> {
        self.all_reduce_slice(&mut buf.0[..n])
    }

    fn gather_cols(&self, _be: &CpuBackend, part: &CpuBuffer, n_rows: usize, n_cols: usize, out: Option<&mut CpuBuffer>) -> Result<()> {
        self.gather_cols_slice(&part.0, n_rows, n_cols, out.map(|o| &mut o.0[..]))
    }

    fn abort(&self) {
        self.shared.barrier.abort();
    }

    fn recover(&self) {
        self.shared.barrier.reset();
        self.calls.store(0, Ordering::Relaxed);
    }

    fn seconds(&self) -> (f64, f64) {
        (self.total_ns.load(Ordering::Relaxed) as f64 * 1e-9, self.wait_ns.load(Ordering::Relaxed) as f64 * 1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f(rank comm)` on one thread per rank; returns the results in rank order.
    fn on_threads<T: Send>(comms: &[LocalComm], f: impl Fn(&LocalComm) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sums_in_rank_order_with_the_same_bits_on_every_rank() {
        // Values whose f32 sum depends on the order: 1e8 + 1 − 1e8 + 1 ...
        let parts = [vec![1e8f32, 0.5, 3.0], vec![1.0, 0.25, -1.0], vec![-1e8, 1e-8, 7.0], vec![1.0, 0.125, 0.0]];
        let comms = LocalComm::group(4).unwrap();
        let out = on_threads(&comms, |c| {
            let mut b = parts[c.rank].clone();
            for _ in 0..3 {
                // the same reduction three times in a row (alternating slot sets)
                let mut x = parts[c.rank].clone();
                c.all_reduce_slice(&mut x).unwrap();
                b = x;
            }
            b
        });
        let want: Vec<f32> = (0..3).map(|i| ((parts[0][i] + parts[1][i]) + parts[2][i]) + parts[3][i]).collect();
        for o in &out {
            assert_eq!(o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
        // ((1e8 + 1) − 1e8) + 1 = 1 in f32 (1e8 + 1 rounds to 1e8), not 2
        assert_eq!(out[0][0], 1.0);
    }

    #[test]
    fn large_all_reduce_takes_the_parallel_path_with_the_same_order() {
        let n = 3 * PAR_MIN + 5;
        let comms = LocalComm::group(3).unwrap();
        let part = |r: usize| (0..n).map(|i| ((i * 7 + r * 13) % 101) as f32 * 0.1 - 5.0).collect::<Vec<f32>>();
        let out = on_threads(&comms, |c| {
            let mut x = part(c.rank);
            c.all_reduce_slice(&mut x).unwrap();
            x
        });
        let (p0, p1, p2) = (part(0), part(1), part(2));
        for i in [0, 1, PAR_MIN, n - 1] {
            assert_eq!(out[1][i].to_bits(), ((p0[i] + p1[i]) + p2[i]).to_bits());
        }
        assert_eq!(out[0], out[2]);
    }

    #[test]
    fn gather_puts_each_ranks_columns_side_by_side_on_rank_0() {
        let comms = LocalComm::group(3).unwrap();
        let cols = [2usize, 3, 1];
        let out = on_threads(&comms, |c| {
            let r = c.rank;
            let part: Vec<f32> = (0..2 * cols[r]).map(|i| (r * 100 + i) as f32).collect();
            let mut out = vec![-1f32; 2 * 6];
            c.gather_cols_slice(&part, 2, cols[r], (r == 0).then_some(&mut out[..])).unwrap();
            out
        });
        assert_eq!(out[0], vec![0., 1., 100., 101., 102., 200., 2., 3., 103., 104., 105., 201.]);
        assert!(out[1].iter().all(|&v| v == -1.0));
    }

    #[test]
    fn abort_wakes_the_waiting_ranks_and_recover_makes_the_group_usable_again() {
        let comms = LocalComm::group(3).unwrap();
        let r = on_threads(&comms, |c| {
            if c.rank == 2 {
                // this rank fails before its collective
                c.abort();
                return Err(FakError::invalid("x", "failed"));
            }
            let mut x = vec![1.0f32; 4];
            c.all_reduce_slice(&mut x)
        });
        assert!(r.iter().all(|x| x.is_err()), "every rank returns");
        for c in &comms {
            c.recover();
        }
        let out = on_threads(&comms, |c| {
            let mut x = vec![c.rank as f32; 2];
            c.all_reduce_slice(&mut x).map(|_| x)
        });
        assert!(out.iter().all(|x| x.as_ref().unwrap() == &vec![3.0, 3.0]));
    }
}
