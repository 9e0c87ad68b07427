"""A numpy model of the chunked Gated DeltaNet prefill (``gdn_chunk_d<D>`` in
rust/kernels/deltanet.cu: chunks of 64 rows, the WY form of the gated delta rule) against the
token-by-token recurrence (``gdn_recurrence_d<D>``, the CPU reference
rust/src/backend/cpu/deltanet.rs).

``chunked`` does what the kernel does, step by step and with its names: per chunk of ``C`` rows
(zero past the sequence's last row), the L2-normalized q and k, the gates, the cumulative
log-decay ``G``, ``A[t][u] = β_t·e^{G_t−G_u}·(k_t·k_u)`` (u < t), the decayed causal
``QK[t][u] = e^{G_t−G_u}·(q_t·k_u)`` (u ≤ t), ``R = β·(V − e^G·K·S_0)``, the forward substitution
``(I + A)·Δ = R`` in place, ``o = (e^G·Q·S_0 + QK·Δ)/√D`` and
``S ← e^{G_last}·S + Kᵀ·(e^{G_last−G}·Δ)``; the value columns in slices of ``JB`` as the kernel's
blocks; then the gated RMSNorm (``gdn_gated_norm_f32``). ``per_token`` is the recurrence as the
per-token kernel runs it (on ``M[j·D + i] = S[i][j]``), in float64.

The chunked model runs in float32 (the kernel's precision) and in float64 (where it must equal the
recurrence to ~1e-10: the algebra, separated from rounding). Cases cover every compiled state size,
chunk boundaries (1, 63, 64, 65, 200 rows), a start from zeros (n_past == 0, the slot's old
contents ignored) and from a random state, strong and weak decay. The kernel itself is checked
against the CPU backend on the GPU (tests/cuda/test_hybrid_cuda.py).
"""

from __future__ import annotations

import numpy as np
import pytest

C = 64  # GDN_CHUNK


def jb_of(d: int) -> int:
    return d if d < 32 else 32  # GDN_CHUNK_JB


def _gates(beta_in: np.ndarray, alpha_in: np.ndarray, dt: float, a: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    one = dtype(1)
    b = one / (one + np.exp(-beta_in.astype(dtype)))
    ax = alpha_in.astype(dtype) + dtype(dt)
    sp = np.where(ax > 20, ax, np.log(one + np.exp(np.minimum(ax, dtype(20)))))
    return b, (sp * dtype(a)).astype(dtype)


def _l2(x: np.ndarray, eps: float, dtype) -> np.ndarray:
    d = x.shape[-1]
    x = x.astype(dtype)
    ss = (x * x).sum(axis=-1, keepdims=True)
    scale = dtype(1) / np.sqrt(ss / dtype(d) + dtype(eps / d))
    return (x * scale) * dtype(1 / np.sqrt(d))


def _gated_norm(o: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float, dtype) -> np.ndarray:
    o, z = o.astype(dtype), z.astype(dtype)
    sc = dtype(1) / np.sqrt((o * o).sum(axis=-1, keepdims=True) / dtype(o.shape[-1]) + dtype(eps))
    return ((o * sc) * w.astype(dtype)) * (z / (dtype(1) + np.exp(-z)))


def per_token(q, k, v, beta_in, alpha_in, z, dt, a, norm_w, m0, n_past, eps):
    """The per-token recurrence of one (sequence, value head) in float64: returns (out, M)."""
    f = np.float64
    d = q.shape[1]
    qn, kn = _l2(q, eps, f), _l2(k, eps, f)
    b, g = _gates(beta_in, alpha_in, dt, a, f)
    m = np.zeros((d, d)) if n_past == 0 else m0.astype(f).reshape(d, d).copy()  # m[j, i] = S[i][j]
    o = np.zeros((len(q), d))
    for t in range(len(q)):
        m *= np.exp(g[t])
        delta = (v[t].astype(f) - m @ kn[t]) * b[t]
        m += np.outer(delta, kn[t])
        o[t] = (m @ qn[t]) / np.sqrt(d)
    return _gated_norm(o, z, norm_w, eps, f), m.reshape(-1)


def chunked(q, k, v, beta_in, alpha_in, z, dt, a, norm_w, m0, n_past, eps, dtype=np.float32, solve: bool = True):
    """The chunked kernel's arithmetic for one (sequence, value head): returns (out, M).
    ``solve=False`` skips the forward substitution (a deliberately wrong model)."""
    f = dtype
    n, d = q.shape
    jb = jb_of(d)
    inv_sqrt_d = f(1 / np.sqrt(d))
    out = np.zeros((n, d), dtype=f)
    m = np.zeros((d, d), dtype=f) if n_past == 0 else m0.astype(f).reshape(d, d).copy()
    for j0 in range(0, d, jb):  # the blocks of one head: a slice of value columns each
        S = m[j0:j0 + jb, :].T.copy()  # S[i][jj]
        for c0 in range(0, n, C):
            nc = min(C, n - c0)
            # 1. q, k normalized, gates; zero rows past the end
            Q, K = np.zeros((C, d), f), np.zeros((C, d), f)
            B, G = np.zeros(C, f), np.zeros(C, f)
            V = np.zeros((C, jb), f)
            Q[:nc] = _l2(q[c0:c0 + nc], eps, f)
            K[:nc] = _l2(k[c0:c0 + nc], eps, f)
            B[:nc], G[:nc] = _gates(beta_in[c0:c0 + nc], alpha_in[c0:c0 + nc], dt, a, f)
            V[:nc] = v[c0:c0 + nc, j0:j0 + jb]
            # 2. the cumulative log-decay, F_u = e^{G_last − G_u}
            G = np.cumsum(G, dtype=f)
            F = np.exp(G[-1] - G)
            # 3. A, QK; R and e^G·Q·S_0
            t_idx, u_idx = np.arange(C)[:, None], np.arange(C)[None, :]
            dec = np.where(u_idx <= t_idx, np.exp(np.where(u_idx <= t_idx, G[:, None] - G[None, :], 0)), 0).astype(f)
            A = np.where(u_idx < t_idx, B[:, None] * (dec * (K @ K.T)), 0).astype(f)
            QK = (dec * (Q @ K.T)).astype(f)
            eG = np.exp(G)
            R = (B[:, None] * (V - eG[:, None] * (K @ S))).astype(f)
            QS = (eG[:, None] * (Q @ S)).astype(f)
            # 4. (I + A)·Δ = R by forward substitution, in place
            for t in range(1, nc if solve else 0):
                R[t] -= A[t, :t] @ R[:t]
            # 5. outputs before the norm; the state at the chunk's end
            o = (QS + QK[:, :nc] @ R[:nc]) * inv_sqrt_d
            out[c0:c0 + nc, j0:j0 + jb] = o[:nc]
            S = (S * np.exp(G[-1]) + K[:nc].T @ (R[:nc] * F[:nc, None])).astype(f)
        m[j0:j0 + jb, :] = S.T
    return _gated_norm(out, z, norm_w, eps, f), m.reshape(-1)


def _inputs(d: int, n: int, n_past: int, decay: str, seed: int):
    rng = np.random.default_rng([seed, d, n, n_past])
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, k, v, z = r(n, d), r(n, d), r(n, d), r(n, d)
    beta_in = r(n)
    # alpha: the decay strength; "strong" makes e^g ~ 1e-3 per token, "weak" keeps it near 1
    alpha_in = {"mixed": r(n), "strong": r(n) * 0.5 + 3.0, "weak": r(n) * 0.5 - 6.0}[decay]
    dt, a = float(rng.standard_normal()), float(-np.exp(rng.standard_normal() * 0.5))
    norm_w = (1 + 0.1 * r(d)).astype(np.float32)
    m0 = (0.1 * r(d * d)) if n_past else (np.full(d * d, np.nan, np.float32))  # a fresh sequence ignores its slot
    return q, k, v, beta_in, alpha_in, z, dt, a, norm_w, m0, n_past, 1e-6


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x.astype(np.float64) - ref) / np.linalg.norm(ref))


CASES = [(d, n, n_past, decay) for d in (16, 32, 64, 128) for n in (1, 63, 64, 65, 200) for n_past in (0, 17) for decay in ("mixed",)]
CASES += [(d, 200, 5, decay) for d in (64, 128) for decay in ("strong", "weak")]


@pytest.mark.parametrize("d,n,n_past,decay", CASES, ids=lambda v: str(v))
def test_chunked_model_matches_the_recurrence(d: int, n: int, n_past: int, decay: str) -> None:
    args = _inputs(d, n, n_past, decay, seed=1)
    want_o, want_m = per_token(*args)
    assert np.isfinite(want_o).all() and np.isfinite(want_m).all()
    # the algebra, without float32 rounding
    o64, m64 = chunked(*args, dtype=np.float64)
    assert _rel(o64, want_o) <= 1e-9 and _rel(m64, want_m) <= 1e-9, (_rel(o64, want_o), _rel(m64, want_m))
    # the kernel's precision
    o32, m32 = chunked(*args, dtype=np.float32)
    assert o32.dtype == np.float32
    eo, em = _rel(o32, want_o), _rel(m32, want_m)
    print(f"D={d} rows={n} n_past={n_past} {decay}: float32 chunked vs recurrence: out {eo:.2e}, state {em:.2e}")
    assert eo <= 2e-5 and em <= 2e-5, (eo, em)


def test_the_model_notices_a_wrong_chunk_step() -> None:
    """A chunked model without the forward substitution (Δ = R) or with perturbed gates differs
    from the recurrence: the comparison above can fail. A sequence split in two equals the whole."""
    args = _inputs(64, 130, 9, "mixed", seed=2)
    want_o, _ = per_token(*args)
    good, _ = chunked(*args, dtype=np.float64)
    assert _rel(good, want_o) <= 1e-9
    q, k, v, beta_in, alpha_in, z, dt, a, norm_w, m0, n_past, eps = args
    nosolve, _ = chunked(*args, dtype=np.float64, solve=False)
    assert _rel(nosolve, want_o) > 1e-3
    # a perturbed gate must show
    bad, _ = chunked(q, k, v, beta_in, alpha_in + 0.05, z, dt, a, norm_w, m0, n_past, eps, dtype=np.float64)
    assert _rel(bad, want_o) > 1e-4
    # splitting in two sequences (the second from the first's state) equals the whole
    o1, m1 = chunked(q[:70], k[:70], v[:70], beta_in[:70], alpha_in[:70], z[:70], dt, a, norm_w, m0, n_past, eps, np.float64)
    o2, _ = chunked(q[70:], k[70:], v[70:], beta_in[70:], alpha_in[70:], z[70:], dt, a, norm_w, m1, n_past + 70, eps, np.float64)
    assert _rel(np.concatenate([o1, o2]), want_o) <= 1e-9
