"""A plain numpy forward pass of the Qwen3.5/3.6 hybrids (``qwen35``, ``qwen35moe``) as llama.cpp
computes them: an executable statement of ``docs/hybrid.md``, checked against llama.cpp's own
intermediate tensors by ``tests/test_parity_llamacpp.py`` (``test_tiny_hybrid_reference_*``).

It is a reference for the structure, not for the bits: weights are dequantized with the ``gguf``
package and every product is float64, except that K, V, Q and the attention probabilities are
rounded to float16 where llama.cpp's F16 KV cache and its F16 dot products round them. On a model
with F32 weights it agrees with llama.cpp to ~1e-6 relative; with quantized weights llama.cpp also
quantizes the activations to 8 bits (Q8_K / Q8_0) before each matmul, and the two agree to a few
1e-2. A wrong structure (a gate taken from the wrong half of ``attn_q``, v heads mapped to q/k heads
in the other order, a missing decay) is off by O(1). One sequence, from an empty state.

    from hybrid_reference import HybridModel
    ref = HybridModel("tiny-qwen35.gguf")
    out = ref.forward(token_ids)        # out.logits [n_tokens, n_vocab], out.trace {(name, layer): array}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf import quants as gguf_quants


def _rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm over the last axis: ``x / sqrt(mean(x^2) + eps)``."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _f16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to float16 (llama.cpp's KV cache type), back in float64."""
    return x.astype(np.float16).astype(np.float64)


def _softplus(x: np.ndarray) -> np.ndarray:
    """ggml's softplus: ``x`` above 20, else ``log(1 + exp(x))``."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


@dataclass
class Forward:
    logits: np.ndarray                                   # [n_tokens, n_vocab]
    trace: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)


class HybridModel:
    """The weights and hyper-parameters of a ``qwen35`` / ``qwen35moe`` GGUF, dequantized to float64."""

    def __init__(self, path: str | Path) -> None:
        r = GGUFReader(path)
        meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
        a = meta["general.architecture"]
        if a not in ("qwen35", "qwen35moe"):
            raise ValueError(f"{path} is {a}, not a qwen35 / qwen35moe hybrid")
        self.arch = a
        self.n_layer = int(meta[f"{a}.block_count"])
        self.n_head = int(meta[f"{a}.attention.head_count"])
        self.n_head_kv = int(meta[f"{a}.attention.head_count_kv"])
        self.head_dim = int(meta[f"{a}.attention.key_length"])
        self.n_rot = int(meta[f"{a}.rope.dimension_count"])
        self.rope_base = float(meta[f"{a}.rope.freq_base"])
        self.eps = float(np.float32(meta[f"{a}.attention.layer_norm_rms_epsilon"]))
        self.d_conv = int(meta[f"{a}.ssm.conv_kernel"])
        self.d_state = int(meta[f"{a}.ssm.state_size"])
        self.n_k_heads = int(meta[f"{a}.ssm.group_count"])
        self.n_v_heads = int(meta[f"{a}.ssm.time_step_rank"])
        self.interval = int(meta[f"{a}.full_attention_interval"])
        self.n_expert_used = int(meta.get(f"{a}.expert_used_count", 0))
        self.w: dict[str, np.ndarray] = {}
        for t in r.tensors:
            data = np.asarray(t.data)
            if t.tensor_type.name not in ("F32", "F16"):
                data = gguf_quants.dequantize(data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape))       # numpy order, slowest first
            self.w[t.name] = np.asarray(data, dtype=np.float64).reshape(shape)
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.interval != 0

    # --- blocks -----------------------------------------------------------------------------------

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return _rms_norm(x, self.eps) * self.w[name]

    def _gated_delta_net(self, h: np.ndarray, i: int, trace: dict) -> np.ndarray:
        """A Gated DeltaNet layer on ``h`` [T, n_embd] (already ``attn_norm``-ed) from a zero state."""
        b, w = f"blk.{i}.", self.w
        T, S, Hk, Hv = h.shape[0], self.d_state, self.n_k_heads, self.n_v_heads
        kd = S * Hk
        qkv = h @ w[b + "attn_qkv.weight"].T                              # [T, 2 kd + vd]: q, k, v rows
        z = h @ w[b + "attn_gate.weight"].T                               # [T, vd]
        beta = _sigmoid(h @ w[b + "ssm_beta.weight"].T)                   # [T, Hv]
        alpha = h @ w[b + "ssm_alpha.weight"].T                           # [T, Hv]
        g = _softplus(alpha + w[b + "ssm_dt.bias"]) * w[b + "ssm_a"]      # log of the decay, <= 0
        # causal depthwise conv over (d_conv - 1) zeros then the tokens; tap j sees token t - (d_conv-1) + j
        kernel = w[b + "ssm_conv1d.weight"]                               # [channels, d_conv]
        padded = np.concatenate([np.zeros((self.d_conv - 1, qkv.shape[1])), qkv])
        conv = sum(padded[j:j + T] * kernel[:, j] for j in range(self.d_conv))
        conv = _silu(conv)
        q = conv[:, :kd].reshape(T, Hk, S)
        k = conv[:, kd:2 * kd].reshape(T, Hk, S)
        v = conv[:, 2 * kd:].reshape(T, Hv, S)
        # the l2 norm: rms_norm(x, eps / n) / sqrt(n) == x / sqrt(sum x^2 + eps)
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + self.eps)
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + self.eps)
        state = np.zeros((Hv, S, S))                      # state[h][i][j] = S[i][j]: k index i, v index j
        out = np.zeros((T, Hv, S))
        for t in range(T):
            for hv in range(Hv):
                hk = hv % Hk                                              # v heads tile the q/k heads
                st = state[hv] * np.exp(g[t, hv])
                delta = (v[t, hv] - st.T @ k[t, hk]) * beta[t, hv]
                st = st + np.outer(k[t, hk], delta)
                out[t, hv] = (st.T @ q[t, hk]) / np.sqrt(S)
                state[hv] = st
        normed = _rms_norm(out, self.eps) * w[b + "ssm_norm.weight"] * _silu(z.reshape(T, Hv, S))
        res = normed.reshape(T, Hv * S) @ w[b + "ssm_out.weight"].T
        trace.update({("conv_output_silu", i): conv, ("gate", i): g, ("beta_sigmoid", i): beta,
                      ("attn_output", i): out, ("linear_attn_out", i): res})
        return res

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """NEOX RoPE on the first ``n_rot`` dims of each head of ``x`` [T, H, hd] at positions 0..T-1
        (M-RoPE with text positions: every section gets the token's position)."""
        T, half = x.shape[0], self.n_rot // 2
        theta = np.arange(T)[:, None] * self.rope_base ** (-2.0 * np.arange(half) / self.n_rot)
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        out = x.copy()
        x0, x1 = x[..., :half], x[..., half:self.n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:self.n_rot] = x0 * sin + x1 * cos
        return out

    def _attention(self, h: np.ndarray, i: int, trace: dict) -> np.ndarray:
        b, w = f"blk.{i}.", self.w
        T, H, Hkv, d = h.shape[0], self.n_head, self.n_head_kv, self.head_dim
        qg = (h @ w[b + "attn_q.weight"].T).reshape(T, H, 2 * d)          # per head: d query rows, d gate rows
        q, gate = qg[..., :d], qg[..., d:].reshape(T, H * d)
        k = (h @ w[b + "attn_k.weight"].T).reshape(T, Hkv, d)
        v = (h @ w[b + "attn_v.weight"].T).reshape(T, Hkv, d)
        q = self._rope(self._norm(q, b + "attn_q_norm.weight"))
        k = self._rope(self._norm(k, b + "attn_k_norm.weight"))
        # llama.cpp's F16 KV cache, and its F16 dot products against it (the f32 operand converted)
        k, v, q = _f16(k), _f16(v), _f16(q)
        heads = np.zeros((T, H, d))
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for hq in range(H):
            hk = hq // (H // Hkv)                                         # GQA: consecutive q heads share
            s = q[:, hq] @ k[:, hk].T / np.sqrt(d) + mask
            p = np.exp(s - s.max(axis=1, keepdims=True))
            heads[:, hq] = _f16(p / p.sum(axis=1, keepdims=True)) @ v[:, hk]
        out = heads.reshape(T, H * d)
        trace[("attn_pregate", i)] = out
        res = (out * _sigmoid(gate)) @ w[b + "attn_output.weight"].T
        trace[("attn_output", i)] = res
        return res

    def _ffn(self, h: np.ndarray, i: int) -> np.ndarray:
        b, w = f"blk.{i}.", self.w
        if self.arch == "qwen35":
            return (_silu(h @ w[b + "ffn_gate.weight"].T) * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
        logits = h @ w[b + "ffn_gate_inp.weight"].T
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            top = np.argsort(-p[t], kind="stable")[:self.n_expert_used]
            weights = p[t, top] / p[t, top].sum()
            for e, wt in zip(top, weights):
                y = _silu(w[b + "ffn_gate_exps.weight"][e] @ h[t]) * (w[b + "ffn_up_exps.weight"][e] @ h[t])
                out[t] += wt * (w[b + "ffn_down_exps.weight"][e] @ y)
        shared = (_silu(h @ w[b + "ffn_gate_shexp.weight"].T) * (h @ w[b + "ffn_up_shexp.weight"].T)) \
            @ w[b + "ffn_down_shexp.weight"].T
        return out + shared * _sigmoid(h @ w[b + "ffn_gate_inp_shexp.weight"])[:, None]

    def forward(self, tokens: list[int]) -> Forward:
        """Logits of every position of ``tokens`` (one sequence from an empty state) and the
        intermediate tensors named as in llama.cpp's graph (``(name, layer)``, token axis first)."""
        trace: dict[tuple[str, int], np.ndarray] = {}
        x = self.w["token_embd.weight"][np.asarray(tokens)]
        for i in range(self.n_layer):
            h = self._norm(x, f"blk.{i}.attn_norm.weight")
            x = x + (self._gated_delta_net(h, i, trace) if self.is_recurrent(i) else self._attention(h, i, trace))
            x = x + self._ffn(self._norm(x, f"blk.{i}.post_attention_norm.weight"), i)
            trace[("l_out", i)] = x
        logits = self._norm(x, "output_norm.weight") @ self.w["output.weight"].T
        return Forward(logits, trace)
