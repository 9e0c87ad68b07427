"""A local stand-in for the Hugging Face hub's file API, on loopback, for `fak pull`'s tests
(``HF_ENDPOINT=http://127.0.0.1:PORT``).

It answers what ``huggingface_hub`` asks when it downloads a file, as the hub does:

- ``HEAD|GET /ORG/NAME/resolve/REV/PATH``: the file, with ``X-Repo-Commit``, ``ETag`` and for LFS
  files ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``; ``Range: bytes=A-B`` answered with 206;
- ``GET /api/models/ORG/NAME/tree/REV[/PATH]?recursive=...``: the file list (path, size, git blob
  id, ``lfs.oid`` = sha256);
- errors as the hub sends them: 404 with ``X-Error-Code: RepoNotFound`` / ``EntryNotFound`` /
  ``RevisionNotFound``, 401 with ``GatedRepo`` for a gated repository without a good token.

Faults for the tests: ``cut(path, after, times)`` sends the headers of the whole file, then closes
the connection after ``after`` bytes (the next ``times`` GETs of it); ``corrupt(path)`` serves other
bytes of the same size than the digest says. ``requests`` records (method, path, Range) of each.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeFile:
    data: bytes
    lfs: bool = True

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def blob_id(self) -> str:
        return hashlib.sha1(f"blob {len(self.data)}\0".encode() + self.data).hexdigest()


@dataclass
class FakeRepo:
    files: dict[str, FakeFile] = field(default_factory=dict)
    token: str | None = None  # gated: requests need "Authorization: Bearer TOKEN"


class FakeHub:
    """The fake hub: ``add(repo, path, data)``, ``start()`` → ``url``, ``stop()``."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.cuts: dict[str, list[int]] = {}
        self.corrupted: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def add(self, repo: str, path: str, data: bytes, *, lfs: bool = True,
            token: str | None = None) -> FakeFile:
        r = self.repos.setdefault(repo, FakeRepo())
        if token is not None:
            r.token = token
        r.files[path] = FakeFile(data, lfs)
        return r.files[path]

    def cut(self, path: str, after: int, times: int = 1) -> None:
        """The next ``times`` GETs of the whole of ``path`` (no Range header) stop after ``after``
        bytes (connection closed); range requests (a resume, a peek at the header) are served."""
        self.cuts[path] = [after] * times

    def corrupt(self, path: str) -> None:
        """Serve ``path`` with its first byte changed (same size, wrong digest)."""
        self.corrupted.add(path)

    def gets(self, path: str) -> list[str | None]:
        """The Range headers of the GETs of the file ``path`` so far (None: the whole file)."""
        return [rng for m, p, rng in self.requests if m == "GET" and p.endswith("/" + path)
                and "/resolve/" in p]

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _error(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _repo(self, org: str, name: str) -> FakeRepo | None:
                repo = hub.repos.get(f"{org}/{name}")
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found")
                    return None
                if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
                    self._error(401, "GatedRepo", f"Access to model {org}/{name} is restricted. "
                                "You must have access to it and be authenticated to access it.")
                    return None
                return repo

            def _serve(self, head: bool) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                parts = path.strip("/").split("/")
                if len(parts) >= 5 and parts[2] == "resolve":
                    self._file(parts[0], parts[1], parts[3], "/".join(parts[4:]), head)
                elif len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "tree":
                    self._tree(parts[2], parts[3], parts[5], "/".join(parts[6:]))
                else:
                    self._error(404, "NotFound", f"no route {path}")

            def _file(self, org: str, name: str, rev: str, fpath: str, head: bool) -> None:
                repo = self._repo(org, name)
                if repo is None:
                    return
                if rev not in ("main", COMMIT):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                    return
                f = repo.files.get(fpath)
                if f is None:
                    self._error(404, "EntryNotFound", f"{fpath} does not exist on \"{rev}\"")
                    return
                data = f.data
                if fpath in hub.corrupted:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                size = len(data)
                start, end, status = 0, size - 1, 200
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a, _, b = rng[6:].partition("-")
                    start = int(a) if a else 0
                    end = min(int(b), size - 1) if b else size - 1
                    status = 206
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                etag = f.sha256 if f.lfs else f.blob_id
                self.send_header("ETag", f'"{etag}"')
                if f.lfs:
                    self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                    self.send_header("X-Linked-Size", str(size))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(end - start + 1))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                if head:
                    return
                body = data[start:end + 1]
                cuts = hub.cuts.get(fpath) if rng is None else None
                if cuts:
                    after = cuts.pop(0)
                    self.wfile.write(body[:after])
                    self.wfile.flush()
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.wfile.write(body)

            def _tree(self, org: str, name: str, rev: str, sub: str) -> None:
                repo = self._repo(org, name)
                if repo is None:
                    return
                if rev not in ("main", COMMIT):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                    return
                items: list[dict[str, object]] = []
                folders: set[str] = set()
                for p, f in sorted(repo.files.items()):
                    if sub and not p.startswith(sub + "/"):
                        continue
                    for i in range(1, p.count("/") + 1):
                        folders.add("/".join(p.split("/")[:i]))
                    item: dict[str, object] = {"type": "file", "oid": f.blob_id, "size": len(f.data),
                                               "path": p}
                    if f.lfs:
                        item["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
                    items.append(item)
                items += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d}
                          for d in sorted(folders)]
                body = json.dumps(items).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
