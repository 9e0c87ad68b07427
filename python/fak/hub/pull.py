"""GGUF models from the Hugging Face hub (`fak pull`, ``--gguf hf://REPO/FILE``).

A model is named as llama.cpp's ``-hf`` and Ollama name them::

    hf://ORG/NAME/FILE.gguf     one file of a repository
    hf://ORG/NAME:Q4_K_M        the repository's file of that quantization
    hf://ORG/NAME               its only GGUF, or its Q4_K_M
    ORG/NAME[@REVISION]         the same without the scheme (fak pull's first argument)

Files come down through ``huggingface_hub`` (``HF_ENDPOINT`` and ``HF_TOKEN`` honoured, a cut
connection resumed from where it stopped) into ``$FAK_MODELS/hf/ORG/NAME/`` (default
``~/.cache/fak/models``). Each file is checked against the hub's digest (the sha256 of an LFS file,
the git blob id of a small one) and removed when it differs; the parts of a split GGUF
(``-00001-of-00003.gguf``) are joined into one file. A model whose ``general.architecture`` fak
does not run is refused from its first bytes, before the download. A file pulled and verified
once is served from the cache without the network (``refresh=True`` asks the hub again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fak.errors import FakError, UnsupportedError
from fak.hub.gguf_split import (GGUFHeaderError, architecture_from_prefix, merge_split, split_name,
                                split_part_names)
from fak.progress import Bar, hf_tqdm, progress_bar

# The architectures fak's engine runs: rust/src/model/config.rs `Arch::from_name` (a test keeps
# the two lists equal).
SUPPORTED_ARCHITECTURES = ("qwen2", "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe")
DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's -hf default when a repository holds several quantizations
SIDECAR = ".fak-pull.json"
PEEK_BYTES = 1 << 20
_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+?)(?:@(?P<rev>[^/:]+))?"
                  r"(?::(?P<quant>[\w.\-]+))?(?:/(?P<file>.+))?$")


class PullError(FakError):
    """A model could not be pulled from the hub: no such repository or file, access refused
    (401/403), a digest that does not match, a network failure. The message says what to do."""


class UnsupportedArchitectureError(PullError, UnsupportedError):
    """The model's ``general.architecture`` is not one fak runs (``.architecture`` names it)."""

    def __init__(self, message: str, architecture: str) -> None:
        super().__init__(message)
        self.architecture = architecture


@dataclass(frozen=True)
class ModelRef:
    """A model on the hub: ``repo`` (``ORG/NAME``), and a ``file`` path in it or a ``quant``
    tag (``Q4_K_M``) or neither; ``revision`` (branch, tag or commit; None: ``main``)."""

    repo: str
    file: str | None = None
    quant: str | None = None
    revision: str | None = None

    def uri(self) -> str:
        """The ``hf://`` spelling of this reference."""
        rev = f"@{self.revision}" if self.revision else ""
        tail = f"/{self.file}" if self.file else f":{self.quant}" if self.quant else ""
        return f"hf://{self.repo}{rev}{tail}"


def is_hf_uri(text: str) -> bool:
    """Whether ``text`` names a hub model (``hf://...``)."""
    return text.startswith("hf://")


def parse_ref(ref: str, file_or_quant: str | None = None, revision: str | None = None) -> ModelRef:
    """A ``ModelRef`` from ``hf://ORG/NAME[@REV][/FILE | :QUANT]`` or ``ORG/NAME`` plus an
    optional second word: a file path (``*.gguf``) or a quantization tag.

    Raises:
        ValueError: ``ref`` is not of that form, or names a file or tag twice."""
    text = ref[5:] if is_hf_uri(ref) else ref
    m = _REF.match(text)
    if m is None:
        raise ValueError(f"{ref!r} is not a hub model: expected hf://ORG/NAME/FILE.gguf, "
                         "hf://ORG/NAME:QUANT or ORG/NAME")
    file, quant = m["file"], m["quant"]
    if file is not None and quant is not None:
        raise ValueError(f"{ref!r} names both a quantization and a file")
    if file_or_quant:
        if file or quant:
            raise ValueError(f"{ref!r} already names a file or quantization; "
                             f"drop {file_or_quant!r}")
        if file_or_quant.lower().endswith(".gguf"):
            file = file_or_quant
        else:
            quant = file_or_quant
    if file is not None and not file.lower().endswith(".gguf"):
        raise ValueError(f"{ref!r}: {file!r} is not a .gguf file")
    return ModelRef(repo=m["repo"], file=file, quant=quant, revision=revision or m["rev"])


def models_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The model cache: ``path``, else ``$FAK_MODELS``, else ``~/.cache/fak/models``."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get("FAK_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fak" / "models"


def repo_dir(ref: ModelRef, root: Path) -> Path:
    """Where the files of ``ref``'s repository are cached: ``ROOT/hf/ORG/NAME``."""
    org, name = ref.repo.split("/", 1)
    return root / "hf" / org / name


def _endpoint() -> str | None:
    ep = os.environ.get("HF_ENDPOINT")
    return ep.rstrip("/") if ep else None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _quant_matches(filename: str, quant: str) -> bool:
    base = filename.rsplit("/", 1)[-1].lower()
    return re.search(rf"(?<![a-z0-9_]){re.escape(quant.lower())}(?![a-z0-9_])", base) is not None


@dataclass
class _Entry:
    path: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # git blob sha1 of a file kept in git


def _ggufs(entries: list[_Entry]) -> list[_Entry]:
    return [e for e in entries if e.path.lower().endswith(".gguf")]


def _sets(entries: list[_Entry]) -> list[list[str]]:
    """GGUF files grouped as models: a split set is one model (named by its first part)."""
    seen: dict[str, list[str]] = {}
    for e in _ggufs(entries):
        folder, _, name = e.path.rpartition("/")
        s = split_name(name)
        key = (folder + "/" + s[0]) if s else e.path
        seen.setdefault(key, []).append(e.path)
    return [sorted(v) for v in seen.values()]


def choose_files(ref: ModelRef, entries: list[_Entry]) -> list[str]:
    """The repository paths to fetch for ``ref``: one file, or every part of a split set.

    Raises:
        PullError: no GGUF file matches, or several do (the message lists them)."""
    names = {e.path for e in entries}
    if ref.file is not None:
        if ref.file not in names:
            raise PullError(_no_file_message(ref, ref.file, entries))
        folder, _, base = ref.file.rpartition("/")
        parts = [(folder + "/" if folder else "") + p for p in split_part_names(base)]
        missing = [p for p in parts if p not in names]
        if missing:
            raise PullError(f"{ref.repo} holds {ref.file} but not the other parts of its split "
                            f"set: {', '.join(missing)}")
        return parts
    models = [s for s in _sets(entries) if "mmproj" not in s[0].rsplit("/", 1)[-1].lower()]
    if ref.quant is not None:
        hits = [s for s in models if _quant_matches(s[0], ref.quant)]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise PullError(f"{ref.repo} has no GGUF file of quantization {ref.quant}; "
                            f"it holds: {_listing(models)}")
        raise PullError(f"{ref.repo} has {len(hits)} GGUF files of quantization {ref.quant}: "
                        f"{_listing(hits)}; name one: fak pull {ref.repo} FILE")
    if len(models) == 1:
        return models[0]
    if not models:
        raise PullError(f"{ref.repo} holds no GGUF file (fak runs GGUF models: look for a "
                        "repository with -GGUF in its name)")
    hits = [s for s in models if _quant_matches(s[0], DEFAULT_QUANT)]
    if len(hits) == 1:
        return hits[0]
    raise PullError(f"{ref.repo} holds {len(models)} GGUF models; name one by file or "
                    f"quantization (fak pull {ref.repo} Q4_K_M): {_listing(models)}")


def _listing(models: list[list[str]]) -> str:
    return ", ".join(s[0] + (f" (+{len(s) - 1} parts)" if len(s) > 1 else "") for s in models)


def _no_file_message(ref: ModelRef, file: str, entries: list[_Entry]) -> str:
    ggufs = _sets(entries)
    return (f"{ref.repo} has no file {file}" + (f"; its GGUF files: {_listing(ggufs)}" if ggufs
                                                 else " and no GGUF file at all"))


def _hub_error(exc: BaseException, ref: ModelRef, what: str) -> PullError:
    """A PullError that says what went wrong with a huggingface_hub call and what to do."""
    from huggingface_hub import errors as hf

    where = _endpoint() or "the Hugging Face hub"
    if isinstance(exc, hf.GatedRepoError):
        return PullError(f"{where} refused {ref.repo} (HTTP {_status(exc)}): the repository is "
                         "gated or private; set HF_TOKEN to a token with access to it and accept the "
                         "model's terms on its page")
    if isinstance(exc, hf.RepositoryNotFoundError):
        status = _status(exc)
        hint = ("HF_TOKEN is set but does not grant access to it" if _token() else
                "if it is private or gated, set HF_TOKEN to a token with access")
        return PullError(f"no repository {ref.repo} on {where} (HTTP {status}): check the name; "
                         f"{hint}")
    if isinstance(exc, hf.RevisionNotFoundError):
        return PullError(f"{ref.repo} has no revision {ref.revision!r}")
    if isinstance(exc, hf.EntryNotFoundError):
        return PullError(f"{ref.repo} has no file {what} (HTTP 404)")
    if isinstance(exc, hf.HfHubHTTPError):
        status = _status(exc)
        if status in (401, 403):
            return PullError(f"{where} refused {what} of {ref.repo} (HTTP {status}); set HF_TOKEN "
                             "to a token with access")
        return PullError(f"{where} answered HTTP {status} for {what} of {ref.repo}: "
                         f"{str(exc).splitlines()[0]}")
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return PullError(f"{ref.uri()} is not in the cache and HF_HUB_OFFLINE is set")
    return PullError(f"could not reach {where} for {what} of {ref.repo}: {exc}; check the network "
                     "(or HF_ENDPOINT) and run again: a cut download resumes")


def _status(exc: BaseException) -> int | str:
    resp = getattr(exc, "response", None)
    return getattr(resp, "status_code", "?")


def _list_repo(ref: ModelRef) -> list[_Entry]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=_endpoint(), token=_token())
    try:
        tree = api.list_repo_tree(ref.repo, revision=ref.revision, recursive=True)
        out = []
        for f in tree:
            if not hasattr(f, "size"):  # a folder
                continue
            lfs = getattr(f, "lfs", None)
            out.append(_Entry(f.path, int(f.size), getattr(lfs, "sha256", None) if lfs else None,
                              getattr(f, "blob_id", None)))
        return out
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes one PullError
        raise _hub_error(exc, ref, "the file list") from exc


def _peek_architecture(ref: ModelRef, path_in_repo: str) -> str | None:
    """``general.architecture`` from the first MiB of a hub file (a range request), or None
    when the key is not there or the server does not answer the range."""
    import httpx
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(ref.repo, path_in_repo, revision=ref.revision, endpoint=_endpoint())
    headers = build_hf_headers(token=_token())
    headers["Range"] = f"bytes=0-{PEEK_BYTES - 1}"
    headers["Accept-Encoding"] = "identity"
    try:
        with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=30) as r:
            if r.status_code not in (200, 206):
                return None
            buf = bytearray()
            for chunk in r.iter_bytes():
                buf += chunk
                if len(buf) >= PEEK_BYTES:
                    break
        return architecture_from_prefix(bytes(buf[:PEEK_BYTES]))
    except (httpx.HTTPError, GGUFHeaderError):
        return None  # the download itself reports the error; the architecture is checked after it


def _unsupported(arch: str, what: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{what} is a {arch!r} model (general.architecture); fak runs "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} — not pulled", arch)


def _digest(path: Path, bar: Bar | None, git_blob: bool) -> str:
    size = path.stat().st_size
    h = hashlib.sha1() if git_blob else hashlib.sha256()
    if git_blob:
        h.update(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            if bar is not None:
                bar.advance(len(chunk))
    return h.hexdigest()


def _verify(path: Path, entry: _Entry, ref: ModelRef, live: bool | None) -> str:
    """The file's sha256; removes the file and raises PullError when the hub's digest differs."""
    with progress_bar(f"verify {path.name}", total=path.stat().st_size, unit="bytes", live=live,
                      transient=True) as bar:
        sha = _digest(path, bar, git_blob=False)
    if entry.sha256 is not None:
        ok, want, got = sha == entry.sha256.lower(), entry.sha256, sha
    elif entry.blob_id is not None:
        got = _digest(path, None, git_blob=True)
        ok, want = got == entry.blob_id.lower(), entry.blob_id
    else:
        return sha  # the hub gave no digest (only a size): nothing more to check
    if not ok:
        path.unlink(missing_ok=True)
        raise PullError(f"checksum mismatch for {entry.path} of {ref.repo}: the hub says {want}, "
                        f"the download is {got}; the file was removed — run fak pull again "
                        "(a proxy or a failing disk can cause this)")
    return sha


def _sidecar(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / SIDECAR).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_sidecar(folder: Path, data: dict[str, Any]) -> None:
    tmp = folder / (SIDECAR + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(folder / SIDECAR)


def _cached(ref: ModelRef, folder: Path) -> Path | None:
    """A verified cached file for ``ref`` (same size and mtime as when it was verified)."""
    records = _sidecar(folder).get("files", {})
    hits = []
    for local, rec in records.items():
        if ref.revision and rec.get("revision") != ref.revision:
            continue
        src = rec.get("source", [])
        if ref.file is not None:
            ok = ref.file in src
        elif ref.quant is not None:
            ok = bool(src) and _quant_matches(src[0], ref.quant)
        else:
            ok = True
        p = folder / local
        if ok and p.is_file():
            st = p.stat()
            if st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns"):
                hits.append(p)
    if ref.file is None and ref.quant is None and len(hits) != 1:
        return None
    return hits[0] if len(hits) == 1 else None


def _local_name(paths: list[str]) -> str:
    """The cached file's path in the repo folder: the file, or the split set's joined name."""
    if len(paths) == 1:
        return paths[0]
    folder, _, name = paths[0].rpartition("/")
    s = split_name(name)
    assert s is not None
    return (folder + "/" if folder else "") + s[0] + ".gguf"


def pull(ref: str | ModelRef, file_or_quant: str | None = None, *, revision: str | None = None,
         root: str | os.PathLike[str] | None = None, refresh: bool = False,
         live: bool | None = None, echo: Any = None) -> Path:
    """Download a GGUF model from the hub into the cache and return its local path.

    Args:
        ref: ``hf://ORG/NAME[/FILE | :QUANT]``, ``ORG/NAME`` or a ``ModelRef``.
        file_or_quant: the file (``*.gguf``) or quantization tag when ``ref`` names neither.
        revision: branch, tag or commit (default ``main``).
        root: the model cache (default ``$FAK_MODELS``, else ``~/.cache/fak/models``).
        refresh: ask the hub even when a verified copy is cached.
        live: progress bars (None: when standard error is a terminal).
        echo: ``echo(str)`` for one-line messages (None: silent).

    Returns the path of one GGUF file (a split model joined).

    Raises:
        ValueError: ``ref`` is not a hub model name.
        UnsupportedArchitectureError: the model's architecture is not one fak runs (refused from
            its first bytes, before the download, when the server answers range requests).
        PullError: no such repository, revision or file; access refused (set ``HF_TOKEN``); the
            download's digest differs from the hub's (the file is removed); the network failed.
        OSError: the cache cannot be written."""
    mref = ref if isinstance(ref, ModelRef) else parse_ref(ref, file_or_quant, revision)
    say = echo or (lambda _msg: None)
    folder = repo_dir(mref, models_dir(root))
    if not refresh:
        hit = _cached(mref, folder)
        if hit is not None:
            return hit
    try:
        import huggingface_hub  # noqa: F401
    except ImportError as exc:  # installed with --no-deps
        raise PullError("fak pull needs huggingface_hub: pip install huggingface_hub") from exc
    entries = _list_repo(mref)
    paths = choose_files(mref, entries)
    by_path = {e.path: e for e in entries}
    arch = _peek_architecture(mref, paths[0])
    if arch is not None and arch not in SUPPORTED_ARCHITECTURES:
        raise _unsupported(arch, f"{mref.repo}/{paths[0]}")
    folder.mkdir(parents=True, exist_ok=True)
    total = sum(by_path[p].size for p in paths)
    say(f"pulling {mref.repo}/{paths[0]}" + (f" (+{len(paths) - 1} parts)" if len(paths) > 1 else "")
        + f": {total / 1e6:,.1f} MB into {folder}")
    local_paths = []
    sha = {}
    for p in paths:
        local_paths.append(_download(mref, p, folder, live))
        sha[p] = _verify(local_paths[-1], by_path[p], mref, live)
    local = _local_name(paths)
    out = folder / local
    if len(paths) > 1:
        with progress_bar(f"join {len(paths)} parts → {out.name}", total=total, unit="bytes",
                          live=live, transient=True) as bar:
            try:
                merge_split(local_paths, out, on_bytes=bar.advance)
            except GGUFHeaderError as exc:
                raise PullError(f"the parts of {mref.repo}/{paths[0]} could not be joined: {exc}") from exc
        for lp in local_paths:
            lp.unlink(missing_ok=True)
    arch = _local_architecture(out)
    if arch is not None and arch not in SUPPORTED_ARCHITECTURES:
        raise _unsupported(arch, f"{out} (from {mref.repo})")
    data = _sidecar(folder)
    st = out.stat()
    data.setdefault("files", {})[local] = {
        "repo": mref.repo, "revision": mref.revision, "source": paths, "sha256": sha,
        "size": st.st_size, "mtime_ns": st.st_mtime_ns, "architecture": arch,
        "endpoint": _endpoint(), "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _save_sidecar(folder, data)
    say(f"pulled {out} ({st.st_size / 1e6:,.1f} MB, {arch or 'architecture unknown'})")
    return out


def _download(ref: ModelRef, path_in_repo: str, folder: Path, live: bool | None) -> Path:
    from huggingface_hub import hf_hub_download

    name = path_in_repo.rsplit("/", 1)[-1]
    with progress_bar(f"download {name}", unit="bytes", live=live) as bar:
        try:
            return Path(hf_hub_download(ref.repo, path_in_repo, revision=ref.revision,
                                        local_dir=folder, endpoint=_endpoint(), token=_token(),
                                        tqdm_class=hf_tqdm(bar) if bar.drawn else None))
        except Exception as exc:  # noqa: BLE001 - every hub failure becomes one PullError
            raise _hub_error(exc, ref, path_in_repo) from exc


def _local_architecture(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return architecture_from_prefix(f.read(PEEK_BYTES))
    except (OSError, GGUFHeaderError):
        return None


@dataclass
class CachedModel:
    """One GGUF file in the model cache: ``name`` (``hf://ORG/NAME/FILE`` for pulled files, the
    file's path under the cache otherwise), ``path``, ``size`` in bytes, ``architecture``
    (None when unreadable) and whether fak runs it."""

    name: str
    path: Path
    size: int
    architecture: str | None
    runs: bool


def list_cached(root: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """Every GGUF file in the model cache (``fak pull --list``), pulled or fetched, sorted by
    name; folders starting with ``.`` (huggingface_hub's partial downloads) are skipped."""
    base = models_dir(root)
    out = []
    for path in _walk_gguf(base):
        rel = path.relative_to(base)
        parts = rel.parts
        name = (f"hf://{parts[1]}/{parts[2]}/{'/'.join(parts[3:])}"
                if len(parts) >= 4 and parts[0] == "hf" else str(rel))
        arch = _local_architecture(path)
        out.append(CachedModel(name, path, path.stat().st_size, arch,
                               arch in SUPPORTED_ARCHITECTURES))
    return sorted(out, key=lambda m: m.name)


def _walk_gguf(base: Path) -> Iterator[Path]:
    if not base.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            if f.lower().endswith(".gguf"):
                yield Path(dirpath) / f


def resolve_model(model: str | os.PathLike[str], *, live: bool | None = None,
                  echo: Any = None) -> Path:
    """The local path of ``model``: a ``hf://`` reference is pulled (from the cache when
    verified there), anything else is returned as a path. Raises what ``pull`` raises."""
    text = os.fspath(model)
    if is_hf_uri(text):
        return pull(text, live=live, echo=echo)
    return Path(text).expanduser()


def cached_model_dict(m: CachedModel) -> dict[str, Any]:
    """``m`` as JSON-ready data (``fak pull --list --json``)."""
    d = asdict(m)
    d["path"] = str(m.path)
    return d
