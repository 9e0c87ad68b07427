"""The ``unshare`` (util-linux) command line of a sandbox: the fallback where bubblewrap is missing
or cannot make its namespaces.

``setpriv --pdeathsig KILL unshare --user --map-root-user --mount --pid --fork --kill-child --ipc
--uts [--net] --propagation private -- python -I -S _nsinit.py CONFIG``: the same namespaces as
bwrap (a user namespace mapping the caller to root, mount, PID, IPC, UTS, network), the mounts,
the capability drop and PID 1 done by ``_nsinit.py`` (see there).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from fak.sandbox.config import Mount

NSINIT = Path(__file__).with_name("_nsinit.py")
HOSTNAME = "fak-sandbox"


@lru_cache(maxsize=1)
def missing_tools() -> list[str]:
    """The commands the ``unshare`` path needs that are not on ``PATH``."""
    return [t for t in ("unshare", "setpriv") if shutil.which(t) is None]


def unshare_argv(mounts: Sequence[Mount], argv: Sequence[str], *, cwd: str,
                 share_net: bool) -> list[str]:
    """The argv that runs ``argv`` in ``cwd`` with ``mounts`` over a read-only ``/`` through
    ``unshare`` and ``_nsinit.py``. ``share_net``: keep the caller's network namespace."""
    cfg = {"mounts": [dataclasses.asdict(m) for m in mounts], "argv": list(argv), "cwd": cwd,
           "hostname": HOSTNAME, "lo_up": not share_net, "disable_userns": True}
    ns = ["--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child", "--ipc",
          "--uts"]
    if not share_net:
        ns.append("--net")
    return [shutil.which("setpriv") or "setpriv", "--pdeathsig", "KILL",
            shutil.which("unshare") or "unshare", *ns, "--propagation", "private", "--",
            sys.executable, "-I", "-S", str(NSINIT), json.dumps(cfg)]
