"""``fak doctor``: what fak can run on this machine — the GPU, its driver and compute capability,
where each CUDA kernel family's image comes from (a cubin embedded in the wheel for sm_XX, NVRTC
at start-up, NVRTC's disk cache, or the driver's PTX JIT), which kernel path runs every op, and
whether the sandbox for model-written commands works here (method, bwrap version, limits).

It also lists every GPU the driver reports and, where there are several, the link between each
pair (what tensor parallelism across them would run over): the driver's peer-to-peer answers
(``cuDeviceCanAccessPeer``, ``cuDeviceGetP2PAttribute``) and, where ``nvidia-smi`` is on ``PATH``,
its ``topo -m`` matrix (``NV#``: # bonded NVLinks; ``PIX``/``PXB``: one/several PCIe switches;
``PHB``: a PCIe host bridge; ``NODE``/``SYS``: across host bridges / NUMA nodes)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import click
from rich.console import Console
from rich.table import Table

from fak import __version__, _native
from fak.sandbox import probe


#: Meaning of the link codes of ``nvidia-smi topo -m`` (its legend).
TOPO_LINKS = {
    "X": "self",
    "NV": "NVLink",
    "PIX": "PCIe, one switch",
    "PXB": "PCIe, several switches",
    "PHB": "PCIe host bridge",
    "NODE": "PCIe host bridges within a NUMA node",
    "SYS": "PCIe and the inter-socket link (QPI/UPI)",
}


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """The GPU-to-GPU cells of ``nvidia-smi topo -m`` output: ``{(i, j): code}`` for every pair of
    GPUs ``i != j`` (``"NV18"``, ``"PIX"``, ``"SYS"``, ...). The header row names the columns
    (``GPU0 GPU1 ... NIC0 ... CPU Affinity ...``, tab-separated); the GPU columns come first, so
    each ``GPUi`` row's first cells are its links to them. Columns and rows that are not GPUs
    (NICs, affinities) are ignored; an output without a GPU header gives ``{}``."""
    gpu_cols: list[int] = []
    links: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        if not gpu_cols and re.fullmatch(r"GPU\d+", cells[0]) and line[:1].isspace():
            for c in cells:
                m = re.fullmatch(r"GPU(\d+)", c)
                if not m:
                    break
                gpu_cols.append(int(m.group(1)))
            continue
        m = re.fullmatch(r"GPU(\d+)", cells[0])
        if gpu_cols and m:
            i = int(m.group(1))
            for j, code in zip(gpu_cols, cells[1:1 + len(gpu_cols)]):
                if i != j:
                    links[(i, j)] = code
    return links


def describe_link(code: str) -> str:
    """``"NV18"`` -> ``"NVLink x18"``, ``"PHB"`` -> its legend text; unknown codes unchanged."""
    m = re.fullmatch(r"NV(\d+)", code)
    if m:
        return f"NVLink x{m.group(1)}"
    return TOPO_LINKS.get(code, code)


def nvidia_smi_topology(timeout: float = 15.0) -> tuple[dict[tuple[int, int], str] | None, str]:
    """``(links, note)``: the parsed ``nvidia-smi topo -m`` matrix, or ``None`` with why not
    (``nvidia-smi`` not on ``PATH``, failed, timed out)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi is not on PATH"
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi topo -m failed: {exc}"
    if out.returncode != 0:
        return None, f"nvidia-smi topo -m exited {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}"
    return parse_topo_matrix(out.stdout), "nvidia-smi topo -m"


def gpu_report() -> dict:
    """Every GPU the driver reports and the links between them: ``available``, ``reason`` (when
    none), ``devices``, ``links`` (one dict per unordered pair ``a < b``: ``peer_access`` both ways,
    the driver's ``perf_rank``, ``native_atomics``, and ``topo``/``topo_meaning`` from
    ``nvidia-smi topo -m`` when it ran), ``topo_note``."""
    info = dict(_native.cuda_devices())
    devices = list(info.get("devices") or [])
    peers = {(p["a"], p["b"]): p for p in info.get("peers") or []}
    topo: dict[tuple[int, int], str] | None = None
    note = "one GPU or none: no link to show"
    if len(devices) > 1:
        topo, note = nvidia_smi_topology()
    links = []
    for a in range(len(devices)):
        for b in range(a + 1, len(devices)):
            ab, ba = peers.get((a, b), {}), peers.get((b, a), {})
            link = {"a": a, "b": b, "peer_access": bool(ab.get("access")) and bool(ba.get("access")),
                    "perf_rank": ab.get("perf_rank"), "native_atomics": bool(ab.get("native_atomics"))}
            if topo is not None and (a, b) in topo:
                link["topo"] = topo[(a, b)]
                link["topo_meaning"] = describe_link(topo[(a, b)])
            links.append(link)
    return {"available": bool(info.get("available")), "reason": info.get("reason"), "devices": devices,
            "links": links, "topo_note": note}


def report(load_kernels: bool = True) -> dict:
    """The doctor's findings as a dict (``fak doctor --json``)."""
    info = dict(_native.cuda_info(load_kernels=load_kernels))
    info["fak_version"] = __version__
    info["cpu_simd"] = _native.simd_level()
    info["sandbox"] = probe().as_dict()
    info["gpus"] = gpu_report()
    return info


def _print_gpus(con: Console, g: dict) -> None:
    if not g["devices"]:
        con.print(f"[yellow]GPUs: none found[/yellow] — {g.get('reason') or 'the driver reports no device'}; "
                  "tensor parallelism runs on the CPU backend only (fak serve --tensor-parallel N)")
        return
    t = Table(title=f"GPUs ({len(g['devices'])})")
    for col in ("#", "name", "compute capability", "memory", "PCI bus"):
        t.add_column(col)
    for d in g["devices"]:
        t.add_row(str(d["ordinal"]), d["name"], d["compute_capability"], f"{d['total_memory_bytes'] / 2**30:.1f} GiB",
                  d["pci_bus_id"])
    con.print(t)
    if len(g["devices"]) < 2:
        return
    t = Table(title=f"Links between GPUs (peer access from the driver; link from {g['topo_note']})")
    for col in ("pair", "link", "peer access", "perf rank", "native atomics"):
        t.add_column(col)
    for link in g["links"]:
        how = f"{link['topo']} ({link['topo_meaning']})" if "topo" in link else "unknown"
        t.add_row(f"GPU{link['a']} - GPU{link['b']}", how, "yes" if link["peer_access"] else "no",
                  str(link["perf_rank"]), "yes" if link["native_atomics"] else "no")
    con.print(t)
    con.print("[yellow]Multi-GPU tensor parallelism (NCCL) is not built in this fak:[/yellow] "
              "--tensor-parallel N runs on the CPU backend (docs/tensor-parallel.md).")


def _print_sandbox(con: Console, sb: dict) -> None:
    if sb["ok"]:
        con.print(f"[green]Sandbox:[/green] {sb['method']} — {sb['detail']}")
    else:
        con.print(f"[red]Sandbox: NOT AVAILABLE[/red] — {sb['detail']}; --allow-exec and "
                  "eval --local refuse to run (--unsafe-no-sandbox runs on the host)")
    for name, how in sb["limits"].items():
        style = "yellow" if how.startswith("NOT") else ""
        con.print(f"  {name}: [{style}]{how}[/]" if style else f"  {name}: {how}")


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--no-kernels", is_flag=True, help="Do not load the kernels (skips NVRTC compilation).")
def doctor(as_json: bool, no_kernels: bool) -> None:
    """Report the GPU, driver, kernel images, the path of every op, and the sandbox."""
    info = report(load_kernels=not no_kernels)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    con = Console()
    con.print(f"[bold]fak {info['fak_version']}[/bold]  CPU backend: {info['cpu_simd']}")
    _print_sandbox(con, info["sandbox"])
    _print_gpus(con, info["gpus"])
    if not info.get("built_with_cuda"):
        con.print("[yellow]CUDA backend: not in this build[/yellow]")
        return
    archs = ", ".join(info.get("build_archs") or []) or "none (kernels compile with NVRTC at start-up)"
    con.print(f"Embedded kernel images: {archs}; NVRTC cache: {info.get('kernel_cache')}")
    if not info.get("available"):
        con.print(f"[red]No usable GPU:[/red] {info.get('reason')}")
        con.print("backend=\"auto\" runs on the CPU; backend=\"cuda\" raises fak.BackendError.")
        return
    mem_gib = info["total_memory_bytes"] / 2**30
    con.print(f"[green]GPU:[/green] {info['device']}  compute capability {info['compute_capability']}  "
              f"{info['sm_count']} SMs  {mem_gib:.1f} GiB  driver CUDA {info['driver_version']}  "
              f"graphs {'on' if info['graphs'] else 'off'}")
    if "kernel_error" in info:
        con.print(f"[red]Kernels failed to load:[/red] {info['kernel_error']}")
    if info.get("kernel_images"):
        t = Table(title="Kernel images", show_lines=False)
        t.add_column("family")
        t.add_column("image")
        for fam, origin in info["kernel_images"].items():
            t.add_row(fam, origin)
        con.print(t)
    if info.get("nvrtc_version"):
        con.print(f"NVRTC {info['nvrtc_version']}")
    t = Table(title="Ops on the GPU")
    t.add_column("op")
    t.add_column("path")
    for op, path in info["ops"].items():
        t.add_row(op, path)
    con.print(t)
