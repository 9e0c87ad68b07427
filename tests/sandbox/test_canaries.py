"""Every case of fak's sandbox corpus (``tests/data/sandbox_cases.jsonl``) and of the policy
evasion corpus (``tests/data/policy_evasions.jsonl``, when present), executed inside the sandbox
with the canaries of ``canaries.py``: 0 canaries harmed is the bar, for allowed and denied cases
alike (the policy is not consulted here: the sandbox must hold on its own).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from canaries import SECRET, Harness, load_cases

from fak.sandbox import Sandbox

DATA = Path(__file__).resolve().parents[1] / "data"
OWN = DATA / "sandbox_cases.jsonl"
POLICY = DATA / "policy_evasions.jsonl"


def _params(path: Path) -> list:
    if not path.exists():
        return []
    return [pytest.param(c, id=str(c.get("id"))) for c in load_cases(path)
            if c.get("tool", "bash") == "bash"]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    with Harness(tmp_path_factory.mktemp("canaries"), SECRET) as h:
        yield h


def test_own_corpus_covers_the_families():
    cases = load_cases(OWN)
    assert len(cases) >= 30
    assert len({c["id"] for c in cases}) == len(cases)
    assert {c["family"] for c in cases} >= {"destroy-home", "destroy-root", "kill-all",
                                            "fork-bomb", "credentials", "network",
                                            "write-outside", "privilege", "resources"}


@pytest.mark.parametrize("case", _params(OWN))
def test_sandbox_case_harms_no_canary(harness, case):
    r = harness.run(case)
    assert r.harms == [], (r.harms, r.result.killed, r.result.output[-800:])


@pytest.mark.parametrize("case", _params(POLICY))
def test_policy_evasion_case_harms_no_canary(harness, case):
    r = harness.run(case)
    assert r.harms == [], (r.harms, r.result.killed, r.result.output[-800:])


class _LeakyHarness(Harness):
    """A harness whose sandbox is made permissive on purpose (after its self-check): the
    canary beside the workspace writable, the host's network, the secret passed in."""

    leaky = False

    def _sandbox(self, ws):
        if not self.leaky:
            return super()._sandbox(ws)
        return Sandbox(ws, writable=[self.outside], net="host", timeout_s=10.0,
                       env={"CANARY_PORT": str(self.listener.port), "LEAK": self.secret})


def test_the_harness_sees_harm(tmp_path):
    """The checks can fail: a sandbox that lets each canary be reached is caught on each."""
    with _LeakyHarness(tmp_path / "leaky", SECRET) as h:
        h.leaky = True
        r = h.run({"id": "leak", "arguments": {"command": (
            "echo changed >> ../outside/canary.txt; echo \"$LEAK\"; "
            "exec 3<>/dev/tcp/127.0.0.1/$CANARY_PORT; sleep 0.3")}})
    assert any("beside the workspace changed" in x for x in r.harms), r.harms
    assert "the secret appeared in the output" in r.harms
    assert "the loopback listener outside got a connection" in r.harms
