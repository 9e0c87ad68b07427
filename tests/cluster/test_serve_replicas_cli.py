"""``fak serve --gguf MODEL --replicas 2 --ray``: the command starts a local Ray cluster, two
replica actors of the real 0.5B and the router on ``--addr``; one request is answered through
it, ``/health`` lists both replicas, and SIGTERM stops it all.

To add a case: start the command with ``fak_process("serve", ...)`` and talk to its URL.
"""

from __future__ import annotations

import httpx

from cluster_procs import fak_process, need_ray


def test_fak_serve_replicas_on_a_local_ray_cluster(model_05b, tmp_path):
    need_ray()
    with fak_process("serve", "--gguf", str(model_05b), "--backend", "cpu", "--n-ctx", "512",
                     "--replicas", "2", "--ray", "--replica-cpus", "1", timeout=240,
                     cwd=tmp_path) as url:
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["mode"] == "router"
        assert [r["name"] for r in health["replicas"]] == ["replica-0", "replica-1"]
        assert all(r["up"] for r in health["replicas"])
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        r = httpx.post(url + "/v1/chat/completions", timeout=120,
                       headers={"X-Fak-Conversation": "cli/1"},
                       json={"model": model, "max_tokens": 2,
                             "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text
        assert r.headers["x-fak-replica"] in ("replica-0", "replica-1")
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
