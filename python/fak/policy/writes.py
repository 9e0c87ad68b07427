"""The files a command writes, from its words: :func:`written_paths`.

Pure functions over one simple command's ``argv``/``dyn`` (see :mod:`fak.policy.commands`),
from the commands' manuals: coreutils (``tee``, ``cp``, ``mv``, ``install``, ``ln``, ``touch``,
``mkdir``, ``mkfifo``, ``mknod``, ``truncate``, ``dd``, ``chmod``/``chown``/``chgrp``, ``sort -o``,
``shuf -o``, ``split``, ``csplit -f``, ``uniq IN OUT``), GNU sed (``-i``, and ``w`` in the
script), awk (``print > "FILE"``), GNU tar (``-C``, the archive of ``-c``/``-r``/``-u``,
old-style option letters), ``unzip -d``, ``7z -o``, ``zip``, ``rsync``, moreutils ``sponge``,
GNU ``patch`` (``-o``, ``-d``, ``-r``, ``-B``, the patched file), compilers' ``-o``, pytest
(``--basetemp``, which pytest deletes and recreates, ``--junitxml``, ``-o cache_dir=``), the
compressors that replace their operands (``gzip``, ``xz``, ``zstd``, ...), ``pip install
--target``, ``find -fprint`` and git (:func:`fak.policy.gitcmd.written_paths`). Nothing here
touches the file system.
"""

from __future__ import annotations

import re

from fak.policy import gitcmd
from fak.policy.commands import (awk_source, getopt, is_awk, parse_find, parse_git, sed_scripts)
from fak.policy.programs import awk_effects, sed_effects

Written = list[tuple[int, str]]


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


_COMPILER = re.compile(r"(?:[\w.]+-)?(?:gcc|g\+\+|cc|c\+\+|clang|clang\+\+|ld|ld\.lld|ld\.gold"
                       r"|as|gfortran|nvcc|rustc|tcc)(?:-[0-9.]+)?\Z")
_COMPRESSORS = frozenset({"gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "lzma", "unlzma",
                          "zstd", "unzstd", "lz4", "unlz4", "compress", "uncompress", "pigz",
                          "pbzip2", "lzip", "brotli"})
_PYTHON = re.compile(r"(?:python|pypy)(?:[0-9.]*)(?:-dbg|m)?\Z")
_CP_LONG = ("target-directory", "suffix", "mode", "owner", "group", "backup", "no-target-directory",
            "recursive", "force", "interactive", "preserve", "no-preserve", "parents", "reflink",
            "sparse", "strip-trailing-slashes", "symbolic-link", "link", "verbose", "update",
            "archive", "attributes-only", "copy-contents", "dereference", "no-dereference",
            "one-file-system", "remove-destination", "context", "debug", "directory",
            "symbolic", "relative", "logical", "physical", "strip", "compare")
_TAR_LETTER_ARGS = "fCbTXKNgVLHIF"
_TAR_LONG_ARGS = _f("file", "directory", "blocking-factor", "files-from", "exclude-from",
                    "starting-file", "newer", "after-date", "listed-incremental", "label",
                    "tape-length", "format", "use-compress-program", "info-script",
                    "new-volume-script", "to-command", "owner", "group", "mode", "mtime",
                    "exclude", "transform", "xform", "strip-components", "checkpoint-action",
                    "rsh-command", "volno-file", "suffix", "backup", "index-file")


def paths_of(cmd) -> Written:
    """:func:`written_paths` of a :class:`~fak.policy.shell.SimpleCommand`, computed once per
    command (kept in ``cmd.cache``)."""
    cache = cmd.cache
    if cache is None:
        cache = cmd.cache = {}
    out = cache.get("writes")
    if out is None:
        out = cache["writes"] = (written_paths(cmd.name, cmd.argv, cmd.dyn)
                                 if cmd.argv and not cmd.dyn[0] else [])
    return out


def written_paths(name: str, argv: list[str], dyn: list[bool]) -> Written:
    """The paths the command ``name`` (``argv[0]``'s basename) writes or replaces, as
    ``(word index, path)``: the path is the word, or the part after an option prefix
    (``--target-directory=DIR``, ``-oFILE``, ``of=FILE``), or a file named inside a sed or awk
    program (then the index is the program's word). ``mv`` sources count: they disappear."""
    fn = _BY_NAME.get(name)
    if fn is not None:
        return fn(argv, dyn)
    if _COMPILER.match(name):
        return _dash_o(argv, 1)
    if name in _COMPRESSORS:
        return _compressor(argv, dyn)
    if is_awk(name):
        src = awk_source(argv, dyn)
        if src is None or src[1]:
            return []
        idx = argv.index(src[0], 1)
        return [(idx, w) for w in awk_effects(src[0])[1]]
    if name in ("pytest", "py.test"):
        return _pytest(argv, 1)
    if _PYTHON.match(name):
        for i in range(1, len(argv) - 1):
            if argv[i] == "-m":
                mod = argv[i + 1]
                if mod == "pytest":
                    return _pytest(argv, i + 2)
                if mod == "pip":
                    return _pip(argv, dyn, i + 2)
                break
            if not argv[i].startswith("-"):
                break
        return []
    if name == "pip" or (name.startswith("pip") and name[3:].replace(".", "").isdigit()):
        return _pip(argv, dyn, 1)
    return []


def _ops(argv: list[str], dyn: list[bool], **kw) -> Written:
    return [(i, argv[i]) for i in getopt(argv, dyn, 1, **kw)[1]]


def _copy_like(name: str):
    def fn(argv: list[str], dyn: list[bool]) -> Written:
        opts, ops = getopt(argv, dyn, 1, short_arg="tSmogB" if name == "install" else "tS",
                           long_arg=_f("target-directory", "suffix", "mode", "owner", "group",
                                       "backup"), long_names=_CP_LONG)
        if name == "install" and any(o[0] in ("-d", "--directory") for o in opts):
            return [(i, argv[i]) for i in ops]
        target = [o for o in opts if o[0] in ("-t", "--target-directory")]
        if target:
            _, value, idx = target[-1]
            dests = [(idx, value)] if idx >= 0 and value is not None else []
            return [(i, argv[i]) for i in ops] + dests if name == "mv" else dests
        if name == "mv":
            return [(i, argv[i]) for i in ops]
        if name == "ln" and len(ops) == 1:
            return []   # the link is created in the current directory, under the target's name
        return [(ops[-1], argv[ops[-1]])] if len(ops) >= 2 else []
    return fn


def _tar(argv: list[str], dyn: list[bool]) -> Written:
    out: Written = []
    creates = False
    archive: tuple[int, str] | None = None
    start = 1
    if len(argv) > 1 and not dyn[1] and argv[1] and not argv[1].startswith("-"):
        j = 2          # old-style letters: `tar czf ARCHIVE DIR`, arguments in letter order
        for ch in argv[1]:
            if ch in "cruA":
                creates = True
            if ch in _TAR_LETTER_ARGS and j < len(argv):
                if ch == "f":
                    archive = (j, argv[j])
                elif ch == "C":
                    out.append((j, argv[j]))
                j += 1
        start = j
    opts, _ = getopt(argv, dyn, start, short_arg=_TAR_LETTER_ARGS, long_arg=_TAR_LONG_ARGS,
                     long_names=(*_TAR_LONG_ARGS, "create", "append", "update", "catenate",
                                 "concatenate", "delete", "extract", "list", "get"))
    for oname, value, idx in opts:
        if oname in ("-c", "-r", "-u", "-A", "--create", "--append", "--update", "--catenate",
                     "--concatenate", "--delete"):
            creates = True
        elif oname in ("-f", "--file") and value is not None and idx >= 0:
            archive = (idx, value)
        elif oname in ("-C", "--directory") and value is not None and idx >= 0:
            out.append((idx, value))
    if creates and archive is not None and archive[1] != "-":
        out.append(archive)
    return out


def _unzip(argv: list[str], dyn: list[bool]) -> Written:
    return [(i + 1, argv[i + 1]) if argv[i] == "-d" else (i, argv[i][2:])
            for i in range(1, len(argv))
            if (argv[i] == "-d" and i + 1 < len(argv)) or (argv[i].startswith("-d")
                                                            and len(argv[i]) > 2)]


def _sevenzip(argv: list[str], dyn: list[bool]) -> Written:
    out = [(i, a[2:]) for i, a in enumerate(argv) if i and a.startswith("-o") and len(a) > 2]
    _, ops = getopt(argv, dyn, 1)
    if ops and argv[ops[0]] in ("a", "u", "d", "rn") and len(ops) > 1:
        out.append((ops[1], argv[ops[1]]))
    return out


def _dash_o(argv: list[str], start: int, long: tuple[str, ...] = ("--output",)) -> Written:
    out: Written = []
    for i in range(start, len(argv)):
        a = argv[i]
        if a == "-o" and i + 1 < len(argv):
            out.append((i + 1, argv[i + 1]))
        elif a.startswith("-o") and len(a) > 2 and not a.startswith("--"):
            out.append((i, a[2:]))
        elif a in long and i + 1 < len(argv):
            out.append((i + 1, argv[i + 1]))
        elif any(a.startswith(x + "=") for x in long):
            out.append((i, a.split("=", 1)[1]))
    return out


def _sort(argv: list[str], dyn: list[bool]) -> Written:
    opts, _ = getopt(argv, dyn, 1, short_arg="kotST",
                     long_arg=_f("key", "output", "field-separator", "buffer-size",
                                 "temporary-directory", "batch-size", "compress-program",
                                 "files0-from", "parallel", "random-source", "sort"),
                     long_names=("output", "temporary-directory", "key", "field-separator"))
    return [(idx, value) for oname, value, idx in opts
            if oname in ("-o", "--output", "-T", "--temporary-directory")
            and value is not None and idx >= 0]


def _shuf(argv: list[str], dyn: list[bool]) -> Written:
    opts, _ = getopt(argv, dyn, 1, short_arg="ino",
                     long_arg=_f("input-range", "head-count", "output", "random-source"),
                     long_names=("output", "input-range", "head-count", "random-source"))
    return [(idx, value) for oname, value, idx in opts
            if oname in ("-o", "--output") and value is not None and idx >= 0]


def _split(argv: list[str], dyn: list[bool]) -> Written:
    _, ops = getopt(argv, dyn, 1, short_arg="abClnt",
                    long_arg=_f("suffix-length", "bytes", "line-bytes", "lines", "number",
                                "separator", "additional-suffix", "filter", "numeric-suffixes",
                                "hex-suffixes"))
    return [(ops[1], argv[ops[1]])] if len(ops) >= 2 else []


def _csplit(argv: list[str], dyn: list[bool]) -> Written:
    opts, _ = getopt(argv, dyn, 1, short_arg="bfn",
                     long_arg=_f("suffix-format", "prefix", "digits"))
    return [(idx, value) for oname, value, idx in opts
            if oname in ("-f", "--prefix") and value is not None and idx >= 0]


def _uniq(argv: list[str], dyn: list[bool]) -> Written:
    _, ops = getopt(argv, dyn, 1, short_arg="fsw",
                    long_arg=_f("skip-fields", "skip-chars", "check-chars", "all-repeated",
                                "group"))
    return [(ops[1], argv[ops[1]])] if len(ops) >= 2 else []


def _patch(argv: list[str], dyn: list[bool]) -> Written:
    opts, ops = getopt(argv, dyn, 1, short_arg="oDdiprBFVYzg",
                       long_arg=_f("output", "directory", "input", "strip", "reject-file",
                                   "prefix", "fuzz", "version-control", "basename-prefix",
                                   "suffix", "get", "ifdef", "quoting-style"))
    out = [(idx, value) for oname, value, idx in opts
           if oname in ("-o", "--output", "-d", "--directory", "-r", "--reject-file", "-B",
                        "--prefix") and value is not None and idx >= 0]
    if ops:
        out.append((ops[0], argv[ops[0]]))
    return out


def _pytest(argv: list[str], start: int) -> Written:
    out: Written = []
    keys = ("--basetemp", "--junitxml", "--junit-xml", "--resultlog", "--result-log")
    for i in range(start, len(argv)):
        a = argv[i]
        if a in keys and i + 1 < len(argv):
            out.append((i + 1, argv[i + 1]))
        elif any(a.startswith(k + "=") for k in keys):
            out.append((i, a.split("=", 1)[1]))
        elif a == "-o" and i + 1 < len(argv) and argv[i + 1].startswith("cache_dir="):
            out.append((i + 1, argv[i + 1].split("=", 1)[1]))
    return out


def _pip(argv: list[str], dyn: list[bool], start: int) -> Written:
    out: Written = []
    keys = ("--target", "-t", "--prefix", "--root", "--src", "-d", "--dest", "-w", "--wheel-dir")
    for i in range(start, len(argv)):
        a = argv[i]
        if a in keys and i + 1 < len(argv):
            out.append((i + 1, argv[i + 1]))
        elif a.startswith("--") and any(a.startswith(k + "=") for k in keys):
            out.append((i, a.split("=", 1)[1]))
    return out


def _compressor(argv: list[str], dyn: list[bool]) -> Written:
    opts, ops = getopt(argv, dyn, 1, short_arg="oSbT",
                       long_arg=_f("suffix", "output", "format", "threads", "memory"))
    names = {o[0] for o in opts}
    if names & {"-c", "--stdout", "--to-stdout", "-t", "--test", "-l", "--list"}:
        return []
    out = [(idx, value) for oname, value, idx in opts
           if oname in ("-o", "--output") and value is not None and idx >= 0]
    return out + [(i, argv[i]) for i in ops]


def _sed(argv: list[str], dyn: list[bool]) -> Written:
    out: Written = []
    for text, tdyn in sed_scripts(argv, dyn):
        if tdyn:
            continue
        idx = argv.index(text, 1)
        out.extend((idx, w) for w in sed_effects(text)[1] if w not in ("/dev/stdout",
                                                                        "/dev/stderr"))
    if not any(a.startswith("-") and not a.startswith("--") and "i" in a
               or a.startswith("--in-place") for a in argv[1:]):
        return out
    opts, ops = getopt(argv, dyn, 1, short_arg="efl", short_opt="i",
                       long_arg=_f("expression", "file", "line-length"))
    if not any(o[0] in ("-i", "--in-place") for o in opts):
        return out
    has_script = any(o[0] in ("-e", "-f", "--expression", "--file") for o in opts)
    return out + [(i, argv[i]) for i in (ops if has_script else ops[1:])]


def _chmod_like(argv: list[str], dyn: list[bool]) -> Written:
    opts, ops = getopt(argv, dyn, 1, long_arg=frozenset())
    if any(o[0] == "--reference" for o in opts):
        return [(i, argv[i]) for i in ops]
    return [(i, argv[i]) for i in ops[1:]]


def _git(argv: list[str], dyn: list[bool]) -> Written:
    return gitcmd.written_paths(argv, dyn, parse_git(argv, dyn).sub)


def _find(argv: list[str], dyn: list[bool]) -> Written:
    return [(i, argv[i]) for i in parse_find(argv, dyn).writes] if "-f" in " ".join(argv) else []


_BY_NAME = {
    "tee": lambda argv, dyn: _ops(argv, dyn, long_arg=frozenset()),
    "sponge": lambda argv, dyn: _ops(argv, dyn),
    "cp": _copy_like("cp"), "mv": _copy_like("mv"), "install": _copy_like("install"),
    "ln": _copy_like("ln"), "rsync": _copy_like("rsync"),
    "touch": lambda argv, dyn: _ops(argv, dyn, short_arg="dtrm",
                                    long_arg=_f("date", "reference", "time")),
    "mkdir": lambda argv, dyn: _ops(argv, dyn, short_arg="m", long_arg=_f("mode", "context")),
    "mkfifo": lambda argv, dyn: _ops(argv, dyn, short_arg="m", long_arg=_f("mode", "context")),
    "mknod": lambda argv, dyn: _ops(argv, dyn, short_arg="m", long_arg=_f("mode", "context"))[:1],
    "truncate": lambda argv, dyn: _ops(argv, dyn, short_arg="sr", long_arg=_f("size", "reference")),
    "dd": lambda argv, dyn: [(i, argv[i][3:] if argv[i].startswith("of=") else argv[i])
                             for i in range(1, len(argv)) if argv[i].startswith("of=") or dyn[i]],
    "sed": _sed,
    "chmod": _chmod_like, "chown": _chmod_like, "chgrp": _chmod_like,
    "tar": _tar, "unzip": _unzip, "7z": _sevenzip, "7za": _sevenzip, "7zr": _sevenzip,
    "zip": lambda argv, dyn: _ops(argv, dyn, short_arg="bntPOZ")[:1],
    "git": _git, "find": _find,
    "sort": _sort, "shuf": _shuf, "split": _split, "csplit": _csplit, "uniq": _uniq,
    "patch": _patch,
}
