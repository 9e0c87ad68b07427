"""The files a patch touches, for path scopes over patch arguments (``PathScope.format:
"apply_patch"``).

Codex's ``apply_patch`` tool takes one text in its own format (``codex-rs/apply-patch``)::

    *** Begin Patch
    *** Add File: path      (then + lines)
    *** Update File: path   (optionally *** Move to: other/path, then @@ hunks)
    *** Delete File: path
    *** End Patch

Every path named by an ``Add File``, ``Update File``, ``Delete File`` or ``Move to`` header
counts, wherever the header stands (Codex's own parser is lenient about what surrounds the
patch, so the policy is too). A text without such headers is read as a unified diff: the paths
of its ``--- ``/``+++ `` lines (``a/``/``b/`` prefixes removed, ``/dev/null`` skipped). A
header with an empty path is an error, so a malformed patch is denied rather than read as
touching nothing.
"""

from __future__ import annotations

import re

__all__ = ["PatchError", "patch_paths"]

_HEADER = re.compile(r"^\*\*\* (Add File|Update File|Delete File|Move to):[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_UNIFIED = re.compile(r"^(?:---|\+\+\+) (.*?)(?:\t.*)?$", re.MULTILINE)


class PatchError(ValueError):
    """A patch header without a path."""


def patch_paths(text: str) -> list[str]:
    """The paths a patch adds, updates, deletes or moves to, in order, each once.

    Raises:
        PatchError: a header names no path.
    """
    out: list[str] = []
    headers = list(_HEADER.finditer(text))
    if headers:
        for m in headers:
            if not m.group(2):
                raise PatchError(f"`*** {m.group(1)}:` names no file")
            out.append(m.group(2))
    else:
        for m in _UNIFIED.finditer(text):
            path = m.group(1).strip()
            if not path or path == "/dev/null":
                continue
            if path.startswith(("a/", "b/")):
                path = path[2:]
            out.append(path)
    return list(dict.fromkeys(out))
