"""``fak doctor``: what fak can run on this machine — the GPU, its driver and compute capability,
where each CUDA kernel family's image comes from (a cubin embedded in the wheel for sm_XX, NVRTC
at start-up, NVRTC's disk cache, or the driver's PTX JIT), which kernel path runs every op, and
whether the sandbox for model-written commands works here (method, bwrap version, limits)."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from fak import __version__, _native
from fak.sandbox import probe


def report(load_kernels: bool = True) -> dict:
    """The doctor's findings as a dict (``fak doctor --json``)."""
    info = dict(_native.cuda_info(load_kernels=load_kernels))
    info["fak_version"] = __version__
    info["cpu_simd"] = _native.simd_level()
    info["sandbox"] = probe().as_dict()
    return info


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
