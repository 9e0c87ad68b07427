"""The routing policy (``fak.cluster.routing``) on its own: conversation affinity, longest cached
prefix, least loaded, the balance guard, a replica marked down, round robin.

To add a case: build a ``Router`` over named replicas, call ``choose`` / ``done`` / ``mark_down``
in the order of the situation and check the replica and the reason returned.
"""

from __future__ import annotations

import pytest

from fak.cluster.routing import NoReplicaError, Router, block_hashes, prompt_key

SYSTEM = "You are a coding agent. " * 20  # 480 characters: 3 whole 128-character blocks


def chat(*contents: str) -> str:
    roles = ["system", "user", "assistant", "tool"]
    return prompt_key({"messages": [{"role": roles[min(i, 3)], "content": c}
                                    for i, c in enumerate(contents)]})


def router(**kw) -> Router:
    return Router([("a", "http://a"), ("b", "http://b")], **kw)


def test_block_hashes_are_chained_and_skip_the_partial_block():
    h1 = block_hashes("x" * 300, 128)
    assert len(h1) == 2
    h2 = block_hashes("x" * 256 + "y" * 128, 128)
    assert h2[:2] == h1 and len(h2) == 3
    # the same block after a different prefix hashes differently
    assert block_hashes("y" * 128 + "x" * 128, 128)[1] != h1[1]


def test_prompt_key_orders_roles_contents_and_tool_calls():
    body = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"id": "1", "function": {"name": "read"}}]}]}
    key = prompt_key(body)
    assert key.startswith("<user>hi") and '"name": "read"' in key
    assert prompt_key({"prompt": "abc"}) == "abc"


def test_conversation_stays_on_its_replica():
    r = router()
    first, why = r.choose(chat(SYSTEM, "task 1"), "run/i1")
    assert why == "least_loaded"
    r.done(first.name)
    # the other replica is idle and the conversation's next turn would also fit there by load
    for turn in range(3):
        again, why = r.choose(chat(SYSTEM, "task 1", f"step {turn}"), "run/i1")
        assert (again.name, why) == (first.name, "conversation")
        r.done(again.name)


def test_new_conversations_follow_the_longest_prefix_then_load():
    r = router()
    long_a = chat(SYSTEM, "shared issue text " * 30)
    a, _ = r.choose(long_a, "c1")
    r.done(a.name)
    b, why = r.choose(chat(SYSTEM, "another task entirely " * 10), "c2")
    # c2 shares only SYSTEM with a; b has nothing: the prefix wins while a is not busier
    assert (b.name, why) == (a.name, "prefix")
    r.done(b.name)
    # prompts with no cached block anywhere go to the least loaded: one each
    one, why1 = r.choose("z" * 50, None)
    other, why2 = r.choose("w" * 50, None)
    assert why1 == why2 == "least_loaded" and other.name != one.name


def test_balance_guard_sends_to_the_idle_replica_when_the_prefix_holder_is_busy():
    r = router(balance_slack=2)
    names = [r.choose(chat(SYSTEM, f"task {i}"), f"c{i}")[0].name for i in range(6)]
    # first goes anywhere; then the prefix holds until it is 3 requests ahead of the other
    assert names[:3] == [names[0]] * 3
    assert set(names) == {"a", "b"}
    snap = r.snapshot()
    loads = {x["name"]: x["in_flight"] for x in snap["replicas"]}
    assert abs(loads["a"] - loads["b"]) <= 3


def test_mark_down_moves_its_conversations_and_503s_when_none_left():
    r = router()
    first, _ = r.choose(chat(SYSTEM, "t"), "c1")
    r.done(first.name)
    r.mark_down(first.name, "ConnectError")
    moved, why = r.choose(chat(SYSTEM, "t", "more"), "c1")
    assert moved.name != first.name and why == "least_loaded"
    r.done(moved.name)
    r.mark_down(moved.name, "ConnectError")
    with pytest.raises(NoReplicaError, match="ConnectError"):
        r.choose("x", "c1")
    r.mark_up(first.name)
    assert r.choose("x", "c1")[0].name == first.name


def test_exclude_skips_replicas_already_tried():
    r = router()
    a, _ = r.choose("p" * 200, "c1")
    b, _ = r.choose("p" * 200, "c1", exclude=[a.name])
    assert b.name != a.name
    with pytest.raises(NoReplicaError):
        r.choose("p", None, exclude=["a", "b"])


def test_round_robin_ignores_conversations_and_prefixes():
    r = router(prefix_aware=False)
    picks = [r.choose(chat(SYSTEM, "t"), "c1") for _ in range(4)]
    assert [p.name for p, _ in picks] == ["a", "b", "a", "b"]
    assert {why for _, why in picks} == {"round_robin"}


def test_index_is_bounded():
    r = router(index_blocks=4, block_chars=8)
    r.choose("x" * 80, None)
    assert max(len(x.index) for x in r.replicas.values()) == 4


def test_names_must_be_unique_and_replicas_given():
    with pytest.raises(ValueError, match="twice"):
        Router([("a", "u"), ("a", "v")])
    with pytest.raises(ValueError, match="at least one"):
        Router([])
