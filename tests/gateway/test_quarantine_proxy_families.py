"""Proxy mode (``fak serve --base-url``) with issue 26's injection families: what the upstream
receives. Issue 26 found about a third of a held-back set of injections reaching the upstream.

Through the gateway and the fake upstream: every tuning injection of the issue-26 families
(``tests/data/quarantine_injected.jsonl``) arrives as the quarantine replacement; of the held-out
injections (``tests/data/quarantine_heldout.jsonl``, never tuned on) exactly the ones the detectors
pass reach the upstream, at most ``HELDOUT_FLOOR``'s complement; every hard negative
(``tests/data/quarantine_hard_negatives.jsonl``: chat-format examples, AGENTS.md notes, ...) goes
through byte for byte. The texts are read from the JSONL files, never passed to a shell.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fak.gateway import BackgroundServer, Upstream
from fak.policy import Policy
from fak.quarantine import scan
from gateway_fakes import FakeUpstream, UpstreamReply

DATA = Path(__file__).parents[1] / "data"
FAMILIES = {"prose_address", "transcript", "agentdojo", "ignore_paraphrase", "multilingual", "encoded",
            "task_injection"}
HELDOUT_FLOOR = 59  # as tests/test_quarantine_detectors.py


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (DATA / name).read_text(encoding="utf-8").splitlines() if x.strip()]


def _conversation(result: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read the file."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.md"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]


@pytest.fixture
def proxy(start_gateway: Any) -> Iterator[tuple[BackgroundServer, FakeUpstream]]:
    fake = FakeUpstream(script={"Read": UpstreamReply(content="ok")})
    with BackgroundServer(fake.app()) as up:
        srv = start_gateway(upstream=Upstream(up.base_url, "k"),
                            policy=Policy.from_dict({"version": 1, "default": {"verdict": "allow", "reason": "ok"},
                                                     "quarantine": {}}))
        yield srv, fake


def _reached(http: httpx.Client, srv: BackgroundServer, fake: FakeUpstream, text: str) -> bool:
    """Whether ``text`` reached the upstream unchanged (else the replacement arrived in its place)."""
    r = http.post(srv.base_url + "/chat/completions", json={"model": "up-model", "messages": _conversation(text)})
    assert r.status_code == 200, r.text
    sent = json.loads(fake.seen[-1][2])["messages"][3]["content"]
    if sent == text:
        return True
    assert sent.startswith("[fak: tool result quarantined: ") and text not in fake.seen[-1][2].decode()
    return False


def test_issue_26_families_never_reach_the_upstream(proxy: Any, http: httpx.Client) -> None:
    srv, fake = proxy
    rows = [r for r in _rows("quarantine_injected.jsonl") if r["family"] in FAMILIES]
    reached = [r["id"] for r in rows if _reached(http, srv, fake, r["content"])]
    assert not reached, reached


def test_heldout_injections_through_the_proxy(proxy: Any, http: httpx.Client) -> None:
    srv, fake = proxy
    rows = _rows("quarantine_heldout.jsonl")
    reached = [r["id"] for r in rows if _reached(http, srv, fake, r["content"])]
    print(f"\nproxy, held-out: {len(reached)}/{len(rows)} reached the upstream: {reached}")
    assert reached == [r["id"] for r in rows if not scan(r["content"]).fired]
    assert len(rows) - len(reached) >= HELDOUT_FLOOR


def test_hard_negatives_reach_the_upstream_unchanged(proxy: Any, http: httpx.Client) -> None:
    srv, fake = proxy
    rows = _rows("quarantine_hard_negatives.jsonl")
    withheld = [r["id"] for r in rows if not _reached(http, srv, fake, r["content"])]
    assert not withheld, withheld
