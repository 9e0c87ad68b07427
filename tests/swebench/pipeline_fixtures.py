"""A tiny repository for the pipeline tests and a rule-based OpenAI-compatible model.

``make_shapes(root)`` builds ``fak-test/shapes`` (a package with a bug in ``scale`` and one in
``Point.__add__``, its tests, docs and a helper module that mention the same names), a bare
mirror ``root/repos/fak-test/shapes``, the dataset rows and a harness spec file.

``RuleServer(responder)`` serves ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``
from ``responder(prompt, request) -> answer`` (``prompt``: the raw prompt, or the messages joined;
``request``: ``{"body", "headers", "mode"}``). In completions mode the answer is the whole
reply, prefill included; the server returns only what follows the prompt (the longest suffix of
the prompt that starts the answer is cut), then applies the request's stop strings, as an
engine continuing a pre-filled answer would.

To add a case: add files to ``SHAPES_FILES``, a row to ``make_shapes`` and rules to
``ShapesModel``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import uvicorn
from litestar import Litestar, Request, get, post
from litestar.response import Response

REPO = "fak-test/shapes"
VERSION = "0.1"

GEOMETRY = '''"""Points in the plane."""


class Point:
    """A point (x, y)."""

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __add__(self, other):
        if not isinstance(other, Point):
            raise TypeError("can only add a Point to a Point")
        return Point(self.x + other.x, self.y + other.y)

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __repr__(self):
        return f"Point({self.x}, {self.y})"

    def norm(self):
        return (self.x ** 2 + self.y ** 2) ** 0.5


def scale(point, factor):
    """The point scaled by factor."""
    return Point(point.x * factor, point.y)
'''

SHAPES_FILES = {
    "shapes/__init__.py": "from shapes.geometry import Point, scale\n",
    "shapes/geometry.py": GEOMETRY,
    "shapes/util.py": "from shapes.geometry import Point\n\n\ndef origin():\n    return Point(0, 0)\n",
    "shapes/tests/__init__.py": "",
    "shapes/tests/test_geometry.py": (
        "from shapes.geometry import Point, scale\n\n\n"
        "def test_add():\n    assert Point(1, 2) + Point(3, 4) == Point(4, 6)\n\n\n"
        "def test_norm():\n    assert Point(3, 4).norm() == 5\n\n\n"
        "def test_scale_x():\n    assert scale(Point(1, 2), 3).x == 3\n\n\n"
        "def test_scale_y_unchanged():\n    assert scale(Point(1, 2), 3).y == 2\n"),
    "docs/geometry.rst": "Use scale(point, factor) to scale a Point.\n",
}

ISSUES = {
    "fak-test__shapes-1": (
        "`scale` does not scale y\n\n"
        "```python\n>>> from shapes import Point, scale\n>>> scale(Point(1, 2), 3)\n"
        "Point(3, 2)\n```\nI expected Point(3, 6).\n"),
    "fak-test__shapes-2": (
        "sum() of points fails\n\n```\n>>> sum([Point(1, 2), Point(3, 4)])\n"
        "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\n"
        "  File \"/usr/lib/python3.11/site-packages/shapes/geometry.py\", line 13, in __add__\n"
        "    raise TypeError(\"can only add a Point to a Point\")\n"
        "TypeError: can only add a Point to a Point\n```\nAdding 0 should give the point back.\n"),
}

SPECS = {REPO: {VERSION: {
    "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    "system_site_packages": True,
    "install": "",
    "test_cmd": "pytest -rA -p no:cacheprovider",
    "log_parser": "parse_log_pytest",
}}}

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def make_shapes(root: Path) -> dict[str, Any]:
    """Build the repo, its bare mirror, ``dataset.jsonl`` and ``specs.json`` under ``root``.

    Returns ``repos``, ``dataset``, ``specs``, ``rows``, ``base_commit``, ``src``,
    ``template`` (a ChatML Jinja file)."""
    src = root / "src"
    src.mkdir(parents=True)
    _git(src, "init", "-q", "-b", "main")
    _git(src, "config", "user.email", "t@example.invalid")
    _git(src, "config", "user.name", "t")
    for rel, text in SHAPES_FILES.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "shapes")
    base = _git(src, "rev-parse", "HEAD")
    repos = root / "repos"
    (repos / "fak-test").mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(repos / "fak-test" / "shapes")],
                   check=True, capture_output=True)
    rows = [{"repo": REPO, "instance_id": iid, "base_commit": base, "patch": "",
             "test_patch": "", "problem_statement": text, "hints_text": "",
             "created_at": "2024-01-01T00:00:00Z", "version": VERSION, "FAIL_TO_PASS": "[]",
             "PASS_TO_PASS": "[]", "environment_setup_commit": base}
            for iid, text in ISSUES.items()]
    dataset = root / "dataset.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = root / "specs.json"
    specs.write_text(json.dumps(SPECS))
    template = root / "chatml.jinja"
    template.write_text(CHATML)
    return {"repos": repos, "dataset": dataset, "specs": specs, "rows": rows, "base_commit": base,
            "src": src, "template": template}


def edit(path: str, search: str, replace: str) -> str:
    """A whole SEARCH/REPLACE answer in a code block."""
    return f"```python\n### {path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```"


def continuation(prompt: str, answer: str) -> str:
    """What follows ``prompt`` in ``answer``: the longest suffix of the prompt that starts the
    answer is cut from it."""
    for k in range(min(len(prompt), len(answer)), 0, -1):
        if answer.startswith(prompt[-k:]):
            return answer[k:]
    return answer


class RuleServer:
    """``responder`` behind uvicorn on a free loopback port (``url``, ``requests``, ``stop()``)."""

    def __init__(self, responder: Callable[[str, dict[str, Any]], str]):
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        def answer(prompt: str, body: dict, headers: dict, mode: str) -> dict:
            text = server.responder(prompt, {"body": body, "headers": headers, "mode": mode})
            if mode == "completions":
                text = continuation(prompt, text)
            finish = "stop"
            for s in body.get("stop") or []:
                if s and s in text:
                    text = text[: text.index(s)]
            with server._lock:
                server.requests.append({"mode": mode, "prompt": prompt, "body": body,
                                        "headers": headers, "answer": text})
            return {"text": text, "finish_reason": finish,
                    "usage": {"prompt_tokens": len(prompt) // 4 + 1,
                              "completion_tokens": len(text) // 4 + 1,
                              "total_tokens": len(prompt) // 4 + len(text) // 4 + 2}}

        @get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "rules", "object": "model", "created": 0,
                                                "owned_by": "fak"}]}

        @post("/v1/completions", status_code=200)
        async def completions(request: Request) -> Response:
            body = await request.json()
            headers = {k.lower(): v for k, v in request.headers.items() if k.lower().startswith("x-fak-")}
            a = answer(body["prompt"], body, headers, "completions")
            return Response(content={"id": f"cmpl-{uuid.uuid4().hex[:8]}", "object": "text_completion",
                                     "created": int(time.time()), "model": "rules",
                                     "choices": [{"index": 0, "text": a["text"],
                                                  "finish_reason": a["finish_reason"]}],
                                     "usage": a["usage"]}, status_code=200)

        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request) -> Response:
            body = await request.json()
            headers = {k.lower(): v for k, v in request.headers.items() if k.lower().startswith("x-fak-")}
            prompt = "\n".join(m.get("content") or "" for m in body["messages"])
            a = answer(prompt, body, headers, "chat")
            return Response(content={"id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                                     "object": "chat.completion", "created": int(time.time()),
                                     "model": "rules",
                                     "choices": [{"index": 0, "finish_reason": a["finish_reason"],
                                                  "message": {"role": "assistant", "content": a["text"]}}],
                                     "usage": a["usage"]}, status_code=200)

        app = Litestar(route_handlers=[models, completions, chat], debug=False)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RuleServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the rule server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


SCALE_LINE = "    return Point(point.x * factor, point.y)"
WRONG_FIX = "    return Point(point.x * factor, point.y + factor)"
RIGHT_FIX = "    return Point(point.x * factor, point.y * factor)"
ADD_LINE = "        if not isinstance(other, Point):"
ADD_FIX = "        if other == 0:\n            return self\n        if not isinstance(other, Point):"


class ShapesModel:
    """The rules for the shapes instances: the file vote names ``shapes/geometry.py``, the
    function vote ``scale`` (shapes-1) or ``Point.__add__`` (shapes-2); repair answers by sample
    index (``index_of``: seed → index, from ``sampler.seed_for``): for shapes-1 the greedy answer
    and most others are the *wrong* fix (``y + factor``), a few the right one, the rest are
    answers that must be dropped (SEARCH not in the file, no change, a syntax error, a comment-
    only change, no block); reproduction scripts: one that shows the bug, one that passes on the
    original code, one that cannot import, one that does not parse. ``rewrite`` answers: the
    right fix (shapes-1), the fix with the method moved to column 0 (shapes-2)."""

    REPAIR_1: ClassVar[list[str]] = [
        edit("shapes/geometry.py", SCALE_LINE, WRONG_FIX),                  # 0 greedy: wrong
        edit("shapes/geometry.py", SCALE_LINE, WRONG_FIX + "  # fixed"),    # 1 same AST as 0
        edit("shapes/geometry.py", "    return point * factor", RIGHT_FIX),  # 2 not in the file
        edit("shapes/geometry.py", SCALE_LINE, SCALE_LINE),                 # 3 no change
        edit("shapes/geometry.py", SCALE_LINE, RIGHT_FIX[:-1]),             # 4 syntax error
        edit("shapes/geometry.py", SCALE_LINE, RIGHT_FIX),                  # 5 right
        "I would change the scale function.",                               # 6 no block
        edit("shapes/geometry.py", SCALE_LINE, SCALE_LINE + "  # TODO"),     # 7 comment only
        ("24      return Point(point.x * factor, point.y)\n=======\n"
         "24      return Point(point.x * factor, point.y + factor)\n>>>>>>> REPLACE"),  # 8 numbers copied, = 0
        edit("shapes/geometry.py", "return Point(point.x * factor, point.y)",
             "return Point(factor * point.x, factor * point.y)"),          # 9 right, other AST
    ]
    SCRIPTS: ClassVar[list[str]] = [
        "```python\nfrom shapes import Point, scale\nassert scale(Point(1, 2), 3) == Point(3, 6)\n```",
        "```python\nfrom shapes import Point, scale\nassert scale(Point(1, 2), 3) == Point(3, 2)\n```",
        "```python\nimport shapes_nowhere\n```",
        "```python\nassert (\n```",
        "```python\nfrom shapes import Point\nassert Point(1, 2) == expected_point\n```",
    ]

    def __init__(self, index_of: dict[str, dict[int, int]]):
        self.index_of = index_of

    def __call__(self, prompt: str, request: dict[str, Any]) -> str:
        body = request["body"]
        iid = request["headers"].get("x-fak-conversation", "/").split("/", 1)[1]
        seed = int(body.get("seed") or 0)
        if "Which one of these files" in prompt:
            return "shapes/geometry.py"
        if "Which function or class" in prompt:
            return "scale" if iid.endswith("-1") else "def Point.__add__(self, other)"
        if "Rewrite these lines" in prompt:
            if iid.endswith("-1"):
                return ('```python\ndef scale(point, factor):\n    """The point scaled by factor."""\n'
                        '    return Point(point.x * factor, point.y * factor)\n```')
            # the method moved to column 0: re-indented when it replaces the region
            return ('```python\ndef __add__(self, other):\n    if other == 0:\n        return self\n'
                    '    if not isinstance(other, Point):\n'
                    '        raise TypeError("can only add a Point to a Point")\n'
                    '    return Point(self.x + other.x, self.y + other.y)\n```')
        if "SEARCH/REPLACE edit" in prompt:
            i = self.index_of.get(f"{iid}/repair", {}).get(seed, 0)
            if iid.endswith("-2"):
                return edit("shapes/geometry.py", ADD_LINE, ADD_FIX)
            text = self.REPAIR_1[i % len(self.REPAIR_1)]
            if i % len(self.REPAIR_1) == 8 and request["mode"] == "completions":
                text = "```python\n### shapes/geometry.py\n<<<<<<< SEARCH\n" + text
            return text
        if "Python script that checks" in prompt:
            i = self.index_of.get(f"{iid}/reproduce", {}).get(seed, 0)
            if iid.endswith("-2"):
                return "```python\nfrom shapes import Point\nassert Point(1, 2) + 0 == Point(1, 2)\n```"
            return self.SCRIPTS[i % len(self.SCRIPTS)]
        return "?"


def shapes_index(n: int = 64) -> dict[str, dict[int, int]]:
    """``{"ID/repair" | "ID/reproduce": {seed: sample index}}`` for the shapes instances."""
    from fak.swebench.pipeline.sampler import seed_for

    out: dict[str, dict[int, int]] = {}
    for iid in ISSUES:
        out[f"{iid}/repair"] = {seed_for(f"{iid}/repair/{r}", i): i for r in range(4) for i in range(n)}
        out[f"{iid}/reproduce"] = {seed_for(f"{iid}/reproduce", i): i for i in range(n)}
    return out
