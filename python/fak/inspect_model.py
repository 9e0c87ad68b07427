"""``fak inspect MODEL.gguf``: what a GGUF file holds, as rich tables or JSON.

``summarize(path)`` reads the header only (metadata, tensor infos; no tensor data) and returns a
``ModelSummary``: metadata with GGUF types, tensors (name, shape in numpy order slowest-first, ggml
type, bytes), bytes and parameters per type, total parameter count, file size. The command renders
it: a header panel, the metadata table (long arrays summarized as length + first items, long
strings cut), the tensor table (``--no-tensors`` hides it), and the per-type table; ``--json``
prints the same summary as JSON. For a mixture-of-experts model (``{arch}.expert_count`` and
``expert_used_count`` in the metadata) the header also gives the experts' share of the parameters,
the parameters active per token and the weight bytes a decode step reads (``ModelSummary.moe``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

from fak.errors import FakError
from fak.gguf import GGUFFile
from fak.hub.cli import GGUF_PATH

__all__ = ["ModelSummary", "TensorRow", "inspect_command", "summarize"]

ARRAY_HEAD = 5          # items shown of a long array
STRING_MAX = 120        # characters shown of a long string


@dataclass
class TensorRow:
    """One tensor: ``shape`` in numpy order (slowest axis first), ``dtype`` a ggml type name."""

    name: str
    shape: list[int]
    dtype: str
    n_elements: int
    n_bytes: int
    offset: int


@dataclass
class TypeRow:
    """Totals of one ggml type over the file's tensors."""

    dtype: str
    n_tensors: int
    n_elements: int
    n_bytes: int


@dataclass
class ModelSummary:
    """A GGUF file's header, summarized (see module docstring). Sizes in bytes."""

    path: str
    file_size: int
    version: int
    alignment: int
    data_offset: int
    metadata: dict[str, dict[str, Any]]      # key -> {"type": "UINT32" | "ARRAY[STRING]" ..., "value" | "length"+"head"}
    tensors: list[TensorRow]
    by_type: list[TypeRow] = field(default_factory=list)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def data_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def moe(self) -> dict[str, Any] | None:
        """For a MoE model (``{arch}.expert_count`` and ``expert_used_count`` set, stacked
        ``*_exps`` tensors present), else None: ``n_expert``, ``n_expert_used``,
        ``expert_params`` / ``expert_bytes`` (every expert), ``active_params`` (parameters one token
        uses: all but the experts, plus ``n_expert_used / n_expert`` of theirs) and
        ``decode_read_bytes`` (weight bytes one decode step reads: as active, without the token
        embedding table, of which a step reads one row)."""
        arch = self.metadata.get("general.architecture", {}).get("value")
        n_expert = self.metadata.get(f"{arch}.expert_count", {}).get("value")
        n_used = self.metadata.get(f"{arch}.expert_used_count", {}).get("value")
        experts = [t for t in self.tensors if "_exps." in t.name]
        if not (isinstance(n_expert, int) and isinstance(n_used, int) and n_expert > 0 and experts):
            return None
        e_params = sum(t.n_elements for t in experts)
        e_bytes = sum(t.n_bytes for t in experts)
        embd = sum(t.n_bytes for t in self.tensors if t.name == "token_embd.weight")
        return {"n_expert": n_expert, "n_expert_used": n_used, "expert_params": e_params, "expert_bytes": e_bytes,
                "active_params": self.n_params - e_params + e_params * n_used // n_expert,
                "decode_read_bytes": self.data_bytes - embd - e_bytes + e_bytes * n_used // n_expert}

    def placement(self, n_cpu_moe: int) -> dict[str, int]:
        """Where the weights live with ``--n-cpu-moe n_cpu_moe`` (the stacked experts of layers
        ``0 .. n_cpu_moe - 1`` in host memory, everything else on the GPU): ``device_bytes`` and
        ``host_bytes`` of tensor data (the KV cache and activations come on top on the GPU)."""
        host = 0
        for t in self.tensors:
            if "_exps." in t.name and t.name.startswith("blk."):
                layer = int(t.name.split(".")[1])
                if layer < n_cpu_moe:
                    host += t.n_bytes
        return {"n_cpu_moe": n_cpu_moe, "device_bytes": self.data_bytes - host, "host_bytes": host}

    def n_layer(self) -> int:
        """Layers (``{arch}.block_count``; 0 when absent)."""
        arch = self.metadata.get("general.architecture", {}).get("value")
        n = self.metadata.get(f"{arch}.block_count", {}).get("value")
        return n if isinstance(n, int) else 0

    def placements(self) -> list[dict[str, int]]:
        """:meth:`placement` at 0, a quarter, half, three quarters and all of the layers (MoE
        models; empty otherwise): what a user of a smaller GPU can read off."""
        if not self.moe:
            return []
        n = self.n_layer()
        return [self.placement(k) for k in sorted({0, n // 4, n // 2, 3 * n // 4, n})]

    def to_json(self, *, tensors: bool = True) -> dict[str, Any]:
        out = asdict(self)
        out["n_params"] = self.n_params
        out["moe"] = self.moe
        out["placements"] = self.placements()
        out["n_tensors"] = len(self.tensors)
        out["data_bytes"] = self.data_bytes
        out["bits_per_weight"] = 8 * self.data_bytes / self.n_params if self.n_params else 0.0
        if not tensors:
            del out["tensors"]
        return out


def _summarize_value(vtype: str, value: Any) -> dict[str, Any]:
    """``{"type", "value"}`` for scalars and short values; ``{"type", "length", "head"}`` for arrays
    longer than ``ARRAY_HEAD``; strings longer than ``STRING_MAX`` cut, with ``"length"``."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", errors="replace")
    if vtype.startswith("ARRAY"):
        items = [v.decode("utf-8", errors="replace") if isinstance(v, (bytes, bytearray)) else v for v in value]
        if len(items) > ARRAY_HEAD:
            return {"type": vtype, "length": len(items), "head": items[:ARRAY_HEAD]}
        return {"type": vtype, "value": items}
    if isinstance(value, str) and len(value) > STRING_MAX:
        return {"type": vtype, "length": len(value), "head": value[:STRING_MAX]}
    if isinstance(value, np.generic):
        value = value.item()
    if vtype == "FLOAT32":  # shortest decimal that round-trips the float32 (1e-06, not 9.99999997e-07)
        value = float(str(np.float32(value)))
    return {"type": vtype, "value": value}


def _read_header(path: Path) -> tuple[int, int, int, dict[str, dict[str, Any]], list[TensorRow]]:
    """(version, alignment, data_offset, metadata, tensors), read with ``fak.gguf`` (header only)."""
    with GGUFFile(path) as f:
        types = f.metadata_types
        meta = {key: _summarize_value(types[key], value) for key, value in f.metadata.items()}
        tensors = [TensorRow(t.name, list(t.shape), t.dtype, t.n_elements, t.n_bytes, t.offset) for t in f.tensors]
        return f.version, f.alignment, f.data_offset, meta, tensors


def summarize(path: str | os.PathLike[str]) -> ModelSummary:
    """Summarize the GGUF file at ``path`` (header only; tensor data is not read).

    Raises:
        FileNotFoundError: no such file.
        fak.GGUFError: the file is not valid GGUF (the message names the problem and byte offset).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such model file: {p}")
    version, alignment, data_offset, meta, tensors = _read_header(p)
    by: dict[str, TypeRow] = {}
    for t in tensors:
        row = by.setdefault(t.dtype, TypeRow(t.dtype, 0, 0, 0))
        row.n_tensors += 1
        row.n_elements += t.n_elements
        row.n_bytes += t.n_bytes
    by_type = sorted(by.values(), key=lambda r: -r.n_bytes)
    return ModelSummary(str(p), p.stat().st_size, version, alignment, data_offset, meta, tensors, by_type)


# --- rendering ---------------------------------------------------------------------------------

def _human_bytes(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _human_count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


def _format_meta(entry: dict[str, Any]) -> str:
    if "length" in entry:
        head = entry["head"]
        if isinstance(head, str):
            flat = " ".join(head.split())
            return f"{flat[:60]!r}… ({entry['length']:,} chars)"
        return f"[{entry['length']:,} items] " + ", ".join(repr(v) for v in head) + ", …"
    return repr(entry["value"]) if isinstance(entry["value"], str) else str(entry["value"])


def render(summary: ModelSummary, *, tensors: bool = True) -> None:
    """Print ``summary`` as rich tables on standard output."""
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    meta = summary.metadata
    arch = meta.get("general.architecture", {}).get("value", "?")
    name = meta.get("general.name", {}).get("value", "")
    n_params = summary.n_params
    bpw = 8 * summary.data_bytes / n_params if n_params else 0.0

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("file", summary.path)
    head.add_row("file size", f"{summary.file_size:,} bytes ({_human_bytes(summary.file_size)})")
    head.add_row("GGUF", f"v{summary.version}, alignment {summary.alignment}, data at byte {summary.data_offset:,}")
    head.add_row("model", f"{name} ({arch})" if name else str(arch))
    head.add_row("parameters", f"{n_params:,} ({_human_count(n_params)})")
    head.add_row("tensors", f"{len(summary.tensors):,}, {summary.data_bytes:,} bytes, {bpw:.2f} bits per weight")
    moe = summary.moe
    if moe:
        head.add_row("experts", f"{moe['n_expert']} per layer, {moe['n_expert_used']} per token: "
                                f"{_human_count(moe['expert_params'])} of the parameters; "
                                f"{_human_count(moe['active_params'])} active per token, "
                                f"~{_human_bytes(moe['decode_read_bytes'])} of weights read per decode step")
        places = ", ".join(f"{p['n_cpu_moe']}: {_human_bytes(p['device_bytes'])} GPU + {_human_bytes(p['host_bytes'])} host"
                           for p in summary.placements())
        head.add_row("--n-cpu-moe N", f"weights by N ({places}); KV cache and activations on the GPU too")
    if "fak.synthetic" in meta:
        head.add_row("synthetic", _format_meta(meta["fak.synthetic"]))
    console.print(head)

    mt = Table(title="metadata", title_justify="left", show_lines=False)
    mt.add_column("key", style="cyan", no_wrap=True)
    mt.add_column("type", style="magenta", no_wrap=True)
    mt.add_column("value", overflow="fold")
    for key, entry in meta.items():
        mt.add_row(key, entry["type"], _format_meta(entry))
    console.print(mt)

    if tensors:
        tt = Table(title="tensors (shape: numpy order, rows × columns)", title_justify="left")
        tt.add_column("#", justify="right", style="dim")
        tt.add_column("name", style="cyan", no_wrap=True)
        tt.add_column("shape", justify="right", no_wrap=True)
        tt.add_column("type", style="magenta")
        tt.add_column("bytes", justify="right")
        for i, t in enumerate(summary.tensors):
            tt.add_row(str(i), t.name, " × ".join(str(d) for d in t.shape), t.dtype, f"{t.n_bytes:,}")
        console.print(tt)

    bt = Table(title="bytes by type", title_justify="left")
    bt.add_column("type", style="magenta")
    bt.add_column("tensors", justify="right")
    bt.add_column("parameters", justify="right")
    bt.add_column("bytes", justify="right")
    bt.add_column("share", justify="right")
    for r in summary.by_type:
        share = r.n_bytes / summary.data_bytes if summary.data_bytes else 0.0
        bt.add_row(r.dtype, str(r.n_tensors), f"{r.n_elements:,}", f"{r.n_bytes:,}", f"{share:.1%}")
    bt.add_row("total", str(len(summary.tensors)), f"{n_params:,}", f"{summary.data_bytes:,}", "100.0%", style="bold")
    console.print(bt)


@click.command("inspect")
@click.argument("model", type=GGUF_PATH)
@click.option("--tensors/--no-tensors", default=True, show_default=True, help="List every tensor.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
def inspect_command(model: Path, tensors: bool, as_json: bool) -> None:
    """Show a GGUF model's metadata, tensors, bytes by type and parameter count (MODEL: a path,
    or hf://ORG/NAME/FILE.gguf pulled into the model cache first)."""
    try:
        summary = summarize(model)
    except (FakError, ValueError, OSError) as exc:
        raise click.ClickException(f"cannot read {model}: {exc}") from exc
    if as_json:
        click.echo(json.dumps(summary.to_json(tensors=tensors), indent=2, ensure_ascii=False))
    else:
        render(summary, tensors=tensors)
