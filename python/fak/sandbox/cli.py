"""``fak sandbox run`` and ``fak sandbox probe`` (click), registered in ``fak.cli``.

Exit status of ``run``: the command's own; 124 when the sandbox's timeout killed it; 137 when
another limit killed it (process limit, output cap); 125 when no sandbox can be made here. A kill
or a limit the command ran into prints one line on stderr: ``fak sandbox: killed: ...``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EXIT_TIMEOUT = 124
EXIT_UNAVAILABLE = 125
EXIT_KILLED = 137


@click.group("sandbox")
def sandbox() -> None:
    """The sandbox fak runs every model-written command in (see docs/sandbox.md)."""


@sandbox.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--workspace", type=click.Path(file_okay=False, exists=True, path_type=Path),
              required=True, help="The only writable tree (besides a private /tmp).")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds.")
@click.option("--net", type=click.Choice(["none", "host"]), default="none", show_default=True,
              help="none: loopback only; host: the host's network (install steps).")
@click.option("--writable", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="Another writable path (repeatable).")
@click.option("--readable", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="A path under a hidden tree ($HOME, /tmp) to show read-only (repeatable).")
@click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE",
              help="A variable to set inside (repeatable).")
@click.option("--method", type=click.Choice(["bwrap", "unshare"]), default=None,
              help="Force a method [default: bwrap where it works].")
@click.option("--max-processes", type=click.IntRange(min=1), default=None,
              help="Process limit [default: 256].")
@click.option("--max-output", type=click.IntRange(min=1), default=None,
              help="Output cap in bytes [default: 8 MiB].")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(workspace: Path, timeout: float, net: str, writable: tuple[Path, ...],
            readable: tuple[Path, ...], env_pairs: tuple[str, ...], method: str | None,
            max_processes: int | None, max_output: int | None, command: tuple[str, ...]) -> None:
    """Run COMMAND in the sandbox around --workspace: prints its output, exits with its status.

    Example: fak sandbox run --workspace . --timeout 30 -- pytest -x tests/"""
    from dataclasses import replace

    from fak.sandbox import Limits, Sandbox, SandboxError

    env = {}
    for pair in env_pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--env wants NAME=VALUE, not {pair!r}")
        env[name] = value
    limits = Limits()
    if max_processes is not None:
        limits = replace(limits, processes=max_processes)
    if max_output is not None:
        limits = replace(limits, output_bytes=max_output)
    try:
        sb = Sandbox(workspace, writable=writable, readable=readable, env=env, timeout_s=timeout,
                     net=net, limits=limits, method=method)
        res = sb.run(list(command))
    except SandboxError as e:
        click.echo(f"fak sandbox: {e}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    sys.stdout.write(res.output)
    sys.stdout.flush()
    if res.note:
        click.echo(f"fak sandbox: {res.note}", err=True)
    if res.returncode is not None:
        sys.exit(res.returncode)
    sys.exit(EXIT_TIMEOUT if res.killed == "timeout" else EXIT_KILLED)


@sandbox.command("probe")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def probe_cmd(as_json: bool) -> None:
    """Say whether the sandbox works here, how, and which limits hold (exit 1 when it does not)."""
    from fak.sandbox import probe

    info = probe()
    if as_json:
        click.echo(json.dumps(info.as_dict(), indent=2))
    else:
        click.echo(("ok: " if info.ok else "NOT AVAILABLE: ") + info.detail)
        for name, how in info.limits.items():
            click.echo(f"  {name}: {how}")
    sys.exit(0 if info.ok else 1)
