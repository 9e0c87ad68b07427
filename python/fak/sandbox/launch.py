"""The launcher in front of bwrap/unshare: one ``bash -c`` that, before anything can fork, joins
the run's pids cgroup, sets the rlimits (inherited by everything in the sandbox), runs the
trusted ``net_setup`` hook in a fresh network namespace, then ``exec``s the sandbox.

``bash`` is used for its ``ulimit`` (``-v``/``-f`` in KiB outside POSIX mode, ``-t`` in seconds).
A launcher failure exits 125 with a ``fak-sandbox: ...`` line on stderr.
"""

from __future__ import annotations

import os
import resource
import shlex
from collections.abc import Sequence
from pathlib import Path

from fak.sandbox.config import Limits, rlimit_kib

BASH = "/bin/bash"

def _clamp(res: int, value: int, unit: int = 1) -> int:
    """``value`` (in ``unit``s) lowered to the current hard limit when it is not infinite
    (raising a hard limit needs CAP_SYS_RESOURCE)."""
    _, hard = resource.getrlimit(res)
    if hard == resource.RLIM_INFINITY or os.geteuid() == 0:
        return value
    return min(value, max(1, hard // unit))


def ulimit_lines(limits: Limits, timeout_s: float, *, nproc: bool) -> list[str]:
    """``ulimit`` commands for ``limits`` (``nproc``: also ``RLIMIT_NPROC``, when no pids cgroup
    holds the process limit)."""
    lines = []
    if limits.open_files:
        lines.append(f"ulimit -n {_clamp(resource.RLIMIT_NOFILE, limits.open_files)}")
    if limits.address_space_bytes:
        kib = rlimit_kib(limits.address_space_bytes)
        lines.append(f"ulimit -v {_clamp(resource.RLIMIT_AS, kib, 1024)}")
    if limits.file_size_bytes:
        kib = rlimit_kib(limits.file_size_bytes)
        lines.append(f"ulimit -f {_clamp(resource.RLIMIT_FSIZE, kib, 1024)}")
    if nproc and limits.processes:
        lines.append(f"ulimit -u {_clamp(resource.RLIMIT_NPROC, limits.processes)}")
    cpu = limits.cpu_seconds(timeout_s)
    if cpu:
        hard = _clamp(resource.RLIMIT_CPU, cpu + 5)
        lines.append(f"ulimit -S -t {min(cpu, hard)} && ulimit -H -t {hard}")
    return lines


def launcher_argv(inner: Sequence[str], *, limits: Limits, timeout_s: float,
                  cgroup_procs: Path | None, net_setup: Sequence[str]) -> list[str]:
    """``bash -c SCRIPT fak-sandbox INNER...``: join ``cgroup_procs``, set the rlimits, run
    ``net_setup`` (shell commands, trusted: fak's own, never a model's) as the caller inside a new
    network namespace with ``lo`` up, then ``exec INNER``."""
    lines = ["set -u"]
    if cgroup_procs is not None:
        q = shlex.quote(str(cgroup_procs))
        lines.append(f"echo $$ > {q} || {{ echo 'fak-sandbox: cannot join the pids cgroup "
                     f"{cgroup_procs}' >&2; exit 125; }}")
    for line in ulimit_lines(limits, timeout_s, nproc=cgroup_procs is None):
        lines.append(f"{line} || {{ echo 'fak-sandbox: {line} failed' >&2; exit 125; }}")
    if net_setup:
        setup = " && ".join(f"{{ {c.strip()} ; }}" for c in net_setup)
        inner_script = (f"ip link set lo up && {setup} || {{ echo 'fak-sandbox: net_setup "
                        "failed' >&2; exit 125; }\nexec \"$@\"")
        lines.append("exec unshare --net -- " + shlex.join([BASH, "--noprofile", "--norc", "-c",
                                                            inner_script, "fak-netns"])
                     + ' "$@"')
    else:
        lines.append('exec "$@"')
    return [BASH, "--noprofile", "--norc", "-c", "\n".join(lines), "fak-sandbox", *inner]
