"""``fak swebench eval``: grade predictions with the official harness (Docker), or locally.

Harness mode runs ``python -m swebench.harness.run_evaluation`` (package ``swebench``) in the
output folder, where it writes its run report ``{model}.{run_id}.json``, and prints
resolved/total from it. Where Docker (a running engine) or the package is missing, it prints the
exact command and exits 0, so the predictions can be graded elsewhere.

Local mode (``--local``) is ``fak.swebench.local.LocalGrader``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

DEFAULT_DATASET = "princeton-nlp/SWE-bench_Verified"


def load_predictions(path: Path) -> list[dict[str, Any]]:
    """Predictions from a JSON list, a JSON map ``{id: prediction}``, or JSONL."""
    text = Path(path).read_text()
    if path.suffix == ".jsonl":
        return [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    data = json.loads(text)
    if isinstance(data, dict):
        data = [{"instance_id": k, **v} for k, v in data.items()]
    return data


def harness_command(predictions: Path, dataset: str, run_id: str, workers: int,
                    output: Path) -> list[str]:
    """The official harness command line for these arguments."""
    return [sys.executable, "-m", "swebench.harness.run_evaluation",
            "--dataset_name", str(dataset), "--predictions_path", str(Path(predictions).resolve()),
            "--run_id", run_id, "--max_workers", str(workers),
            "--report_dir", str(Path(output).resolve())]


def docker_available() -> bool:
    """True when a Docker engine answers (``docker info`` exits 0), not just the client."""
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def swebench_available() -> bool:
    """True when ``swebench.harness.run_evaluation`` can be found (not run) by this Python."""
    import importlib.util

    try:
        return importlib.util.find_spec("swebench.harness.run_evaluation") is not None
    except Exception:  # noqa: BLE001 - a broken parent package means: not usable
        return False


def run_harness(predictions: Path, dataset: str, run_id: str, workers: int, output: Path,
                echo=print) -> int:
    """Run the official harness (or print its command when it cannot run here). Returns the exit
    status for the CLI."""
    cmd = harness_command(predictions, dataset, run_id, workers, output)
    printable = shlex.join(cmd)
    missing = [what for what, ok in (("a Docker engine", docker_available()),
                                     ("the swebench package", swebench_available())) if not ok]
    if missing:
        echo(f"not running the official harness here ({' and '.join(missing)} missing); run:")
        echo(f"  cd {shlex.quote(str(Path(output).resolve()))} && {printable}")
        echo("or grade without Docker: fak swebench eval --local ...")
        return 0
    output.mkdir(parents=True, exist_ok=True)
    echo(f"$ {printable}")
    proc = subprocess.run(cmd, cwd=output)
    if proc.returncode != 0:
        return proc.returncode
    preds = load_predictions(predictions)
    if not preds:
        return 0
    model = str(preds[0]["model_name_or_path"]).replace("/", "__")
    report_path = output / f"{model}.{run_id}.json"
    if not report_path.exists():
        echo(f"the harness wrote no report at {report_path}")
        return 1
    report = json.loads(report_path.read_text())
    echo(f"resolved {report['resolved_instances']}/{report['total_instances']} "
         f"(submitted {report['submitted_instances']}, errors {report['error_instances']}, "
         f"empty {report['empty_patch_instances']}) — {report_path}")
    return 0
