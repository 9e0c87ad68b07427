"""Repeated read-only calls served inline (python/fak/gateway/inline_reads.py, ``fak serve
--serve-inline-reads``) with the scripted fake engine.

The fake engine answers with the reply of the trigger found last in the prompt, so a script
can say "after this result, ask for the same read again" and "after the read is answered, move
on". To add a case, write the conversation and the script, and assert on what the client gets
and on ``fak.inline_reads``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fak.gateway.inline_reads import InlineReads
from fak.policy import Policy
from gateway_fakes import FakeEngine

READ_A = '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
RUN_TESTS = '<tool_call>\n{"name": "bash", "arguments": {"command": "python -m pytest -q"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
         for n in ("read", "list", "edit", "bash")]


def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def result(cid: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": text}


HISTORY = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix the bug in a.py"},
    call("c1", "read", {"path": "a.py"}), result("c1", "CONTENT-A: def f(): return 1"),
    call("c2", "list", {}), result("c2", "FILES-LIST: a.py b.py"),
]


def post(http: httpx.Client, srv: Any, messages: list[dict[str, Any]], conversation: str | None = "conv-i",
         **extra: Any) -> dict[str, Any]:
    headers = {"X-Fak-Conversation": conversation} if conversation else {}
    r = http.post(srv.base_url + "/chat/completions", headers=headers,
                  json={"model": "fake-qwen", "messages": messages, "tools": TOOLS, **extra})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(script=[("FILES-LIST", READ_A), ("CONTENT-A", RUN_TESTS)])


def test_repeated_read_is_served_inline(start_gateway: Any, engine: FakeEngine, http: httpx.Client) -> None:
    srv = start_gateway(engine=engine, serve_inline_reads=True)
    body = post(http, srv, HISTORY)
    msg = body["choices"][0]["message"]
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [{"command": "python -m pytest -q"}]
    pairs = body["fak"]["inline_reads"]
    assert len(pairs) == 1 and pairs[0]["served_from"] == "c1"
    assert pairs[0]["assistant"]["tool_calls"][0]["function"]["name"] == "read"
    assert pairs[0]["tool"]["content"] == "CONTENT-A: def f(): return 1"
    assert pairs[0]["tool"]["tool_call_id"] == pairs[0]["assistant"]["tool_calls"][0]["id"]
    # the second generation saw the pair: its prompt ends with the served result
    second = engine.detokenize(engine.requests[-1][0])
    assert second.rstrip().endswith("<|im_start|>assistant") and second.count("CONTENT-A") == 2
    assert len(engine.requests) == 2
    # a client that appends the pairs sends exactly the prompt the model saw
    seen = engine.requests[-1][0]
    post(http, srv, HISTORY + [pairs[0]["assistant"], pairs[0]["tool"]])
    assert engine.requests[-1][0] == seen


def test_a_write_since_means_run_again(start_gateway: Any, engine: FakeEngine, http: httpx.Client) -> None:
    srv = start_gateway(engine=engine, serve_inline_reads=True)
    edited = HISTORY[:4] + [call("c9", "edit", {"path": "a.py", "old": "1", "new": "2"}), result("c9", "ok")] + HISTORY[4:]
    body = post(http, srv, edited)
    assert "fak" not in body
    assert json.loads(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"path": "a.py"}
    for cmd in ("sed -i s/1/2/ a.py", "python x.py", "echo hi > a.py", "git checkout a.py"):
        hist = HISTORY[:4] + [call("c8", "bash", {"command": cmd}), result("c8", "")] + HISTORY[4:]
        assert "fak" not in post(http, srv, hist), cmd


def test_off_without_flag_header_or_policy_allow(start_gateway: Any, engine: FakeEngine, http: httpx.Client) -> None:
    srv = start_gateway(engine=engine)
    assert "fak" not in post(http, srv, HISTORY)
    srv2 = start_gateway(engine=engine, serve_inline_reads=True)
    assert "fak" not in post(http, srv2, HISTORY, conversation=None)
    deny_read = Policy.from_dict({"version": 1, "default": {"verdict": "allow", "reason": "ok"},
                                  "tools": {"read": {"allowed": False, "reason": "no reads"}}})
    srv3 = start_gateway(engine=engine, serve_inline_reads=True, policy=deny_read)
    body = post(http, srv3, HISTORY)
    assert "fak" not in body and "no reads" in body["choices"][0]["message"]["content"]


LIST = '<tool_call>\n{"name": "list", "arguments": {}}\n</tool_call>'
READ_B = '<tool_call>\n{"name": "read", "arguments": {"path": "b.py"}}\n</tool_call>'


def test_policy_verdicts_and_cap(start_gateway: Any, http: httpx.Client) -> None:
    # Three different earlier reads asked for again in turn, then the first a third time.
    history = HISTORY + [call("c3", "read", {"path": "b.py"}), result("c3", "CONTENT-B: def g(): return 2")]
    tour = FakeEngine(script=[("CONTENT-B", READ_A), ("CONTENT-A", LIST), ("FILES-LIST", READ_B)])
    policy = Policy.from_dict({"version": 1, "default": {"verdict": "allow", "reason": "ok"}})
    srv = start_gateway(engine=tour, serve_inline_reads=True, policy=policy)
    body = post(http, srv, history)
    pairs = body["fak"]["inline_reads"]
    assert [p["served_from"] for p in pairs] == ["c1", "c2", "c3"], "at most max_inline pairs"
    assert all(p["verdict"]["allowed"] for p in pairs)
    assert len(body["fak_policy"]["verdicts"]) == 1, "fak_policy: the returned round's verdicts only"
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read"
    assert body["usage"]["prompt_tokens"] == sum(len(p) for p, _ in tour.requests)


def test_loops_go_to_the_client(start_gateway: Any, http: httpx.Client) -> None:
    """A model that keeps re-reading (greedy decoding's loop) gets one read served, then the
    immediate repeat goes to the client, whose agent handles repeats; a read already answered
    twice is not served again either."""
    loop = FakeEngine(script=[("FILES-LIST", READ_A), ("CONTENT-A", READ_A)])
    srv = start_gateway(engine=loop, serve_inline_reads=True)
    body = post(http, srv, HISTORY)
    assert [p["served_from"] for p in body["fak"]["inline_reads"]] == ["c1"]
    assert body["fak"]["inline_stopped"] == "repeat"
    assert json.loads(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"path": "a.py"}
    assert len(loop.requests) == 2
    gw = srv.app.state.gateway.inline_reads
    assert (gw.served, gw.refused_repeat) == (1, 1)
    # the conversation as the client continues it: the served pair, then its own run of the read
    pair = body["fak"]["inline_reads"][0]
    ran = HISTORY + [pair["assistant"], pair["tool"], call("c5", "read", {"path": "a.py"}), result("c5", "CONTENT-A: def f(): return 1")]
    body = post(http, srv, ran + [call("c6", "list", {}), result("c6", "FILES-LIST: a.py b.py")])
    assert body["fak"] == {"inline_reads": [], "inline_stopped": "repeat", "served_at": body["fak"]["served_at"]}, \
        "a.py's result is in the conversation three times: not served again"
    assert not InlineReads.is_loop(HISTORY, "read", json.dumps({"path": "a.py"}))
    twice = HISTORY + [call("c5", "read", {"path": "a.py"}), result("c5", "CONTENT-A"), call("c6", "list", {}), result("c6", "FILES")]
    assert InlineReads.is_loop(twice, "read", json.dumps({"path": "a.py"})), "answered twice since the last write"
    assert InlineReads.is_loop(HISTORY, "list", json.dumps({}))
    # a write in between starts the count again
    edited = ran + [call("c7", "edit", {"path": "a.py", "old": "1", "new": "2"}), result("c7", "ok"),
                    call("c8", "list", {}), result("c8", "FILES-LIST")]
    assert not InlineReads.is_loop(edited, "read", json.dumps({"path": "a.py"}))


def test_a_result_that_would_not_fit_goes_to_the_client(start_gateway: Any, http: httpx.Client) -> None:
    """Served inline, the second copy of a long result would leave the completion less than its
    max_tokens: the call goes to the client (which can cut the output) instead of the request
    failing with context_length_exceeded; nothing is counted as served."""
    big = "CONTENT-A: " + "x = 1  # filler line\n" * 62  # ~1,300 characters: one copy fits, two do not
    history = HISTORY[:3] + [result("c1", big)] + HISTORY[4:]
    engine = FakeEngine(script=[("FILES-LIST", READ_A), ("CONTENT-A", RUN_TESTS)], n_ctx=4096)
    srv = start_gateway(engine=engine, serve_inline_reads=True)
    body = post(http, srv, history, max_tokens=1024)
    call_ = body["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in call_] == ["read"], "the read itself, for the client to run"
    assert body["fak"]["inline_reads"] == [] and body["fak"]["inline_stopped"] == "context_length"
    assert len(engine.requests) == 1, "the round that would not fit never reached the engine"
    assert srv.app.state.gateway.inline_reads.served == 0
    assert srv.app.state.gateway.inline_reads.refused_context == 1
    # the same conversation with room to spare is served inline as usual
    body = post(http, srv, history, max_tokens=200)
    assert len(body["fak"]["inline_reads"]) == 1 and "inline_stopped" not in body["fak"]


def test_streams_are_not_inlined(start_gateway: Any, engine: FakeEngine, http: httpx.Client) -> None:
    srv = start_gateway(engine=engine, serve_inline_reads=True)
    r = http.post(srv.base_url + "/chat/completions", headers={"X-Fak-Conversation": "s"},
                  json={"model": "fake-qwen", "messages": HISTORY, "tools": TOOLS, "stream": True})
    assert r.status_code == 200 and '"inline_reads"' not in r.text


def test_store_keeps_the_first_full_result() -> None:
    from fak.agent.tools import truncate_middle

    inline = InlineReads()
    inline.remember("c", HISTORY)
    shortened = [dict(m) for m in HISTORY]
    cut = truncate_middle("CONTENT-A: def f(): return 1", 16)  # the fleet agent's observation cut
    shortened[3]["content"] = cut
    inline.remember("c", shortened)
    assert inline.find("c", shortened, "read", '{"path": "a.py"}') == ("c1", "CONTENT-A: def f(): return 1")
    assert inline.find("c", shortened, "read", '{"path": "b.py"}') is None
    assert inline.find("other", shortened, "read", '{"path":"a.py"}') == ("c1", cut)
    # any other shortening is a changed result: what the client sends now is served
    other = [dict(m) for m in HISTORY]
    other[3]["content"] = "CONTENT-A: [cut]"
    inline.remember("c", other)
    assert inline.find("c", other, "read", '{"path": "a.py"}') == ("c1", "CONTENT-A: [cut]")


def test_a_changed_result_replaces_the_kept_one(start_gateway: Any, engine: FakeEngine, http: httpx.Client) -> None:
    """The gateway serves the result the client sends now: a changed copy of a tool result (say a
    quarantine's replacement) replaces the text it kept (found by a new-user test: it served the
    first text). A copy the fleet agent cut in the middle is served in full."""
    from fak.agent.tools import truncate_middle

    srv = start_gateway(engine=engine, serve_inline_reads=True)
    first = post(http, srv, HISTORY, conversation="conv-change")
    assert first["fak"]["inline_reads"][0]["tool"]["content"] == "CONTENT-A: def f(): return 1"
    changed = HISTORY[:3] + [result("c1", "CONTENT-A: [fak: tool result quarantined]")] + HISTORY[4:]
    second = post(http, srv, changed, conversation="conv-change")
    assert second["fak"]["inline_reads"][0]["tool"]["content"] == "CONTENT-A: [fak: tool result quarantined]"
    # a long result, then the same history with that result cut in the middle by the agent
    full = "CONTENT-A: " + "".join(f"line {i}\n" for i in range(100))
    long_history = HISTORY[:3] + [result("c1", full)] + HISTORY[4:]
    assert post(http, srv, long_history, conversation="conv-cut")["fak"]["inline_reads"][0]["tool"]["content"] == full
    cut = truncate_middle(full, 200)
    assert cut != full and cut.startswith("CONTENT-A")
    cut_history = HISTORY[:3] + [result("c1", cut)] + HISTORY[4:]
    served = post(http, srv, cut_history, conversation="conv-cut")["fak"]["inline_reads"][0]["tool"]["content"]
    assert served == full, "the cut copy is served in full"
