"""``fak swebench run`` and ``fak swebench eval`` (click), registered in ``fak.cli``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from fak.agent.protocols import DEFAULT_PROTOCOL, PROTOCOLS


@click.group("swebench")
def swebench() -> None:
    """SWE-bench: run the fleet agent on instances, grade the predictions."""


@swebench.command("run")
@click.option("--agent", "agent_name", type=click.Choice(["fleet"]), default="fleet", show_default=True,
              help="Agent to run (fak's fleet agent).")
@click.option("--gateway", required=True, help="fak serve address: HOST:PORT or a full URL.")
@click.option("--model", required=True, help="Model name sent to the gateway.")
@click.option("--dataset", required=True, help="Rows as JSON/JSONL, or a Hugging Face dataset name.")
@click.option("--filter", "filter_spec", default=None,
              help="smoke | ID,ID,... | REGEX (searched in instance ids).")
@click.option("--difficulty", "difficulty_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Difficulty labels: JSON map id→label, or .meta.jsonl rows.")
@click.option("--difficulty-label", "difficulty_labels", multiple=True,
              help="Keep only these labels (repeatable; easy|medium|hard|very_hard or Verified's "
                   "own labels). Without --difficulty, the rows' own field is used.")
@click.option("--allow-exec", is_flag=True, help="Give the agent the bash tool (no network).")
@click.option("--unsafe-network", is_flag=True,
              help="Run bash with the host's network if `unshare -n` is not permitted.")
@click.option("--max-steps", type=int, default=30, show_default=True, help="Model turns per instance.")
@click.option("--workers", type=int, default=1, show_default=True, help="Agents at once.")
@click.option("--repos", "repos_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder of local git mirrors DIR/OWNER/NAME (else clone from GitHub).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output folder; re-running the same folder skips finished instances.")
@click.option("--protocol", type=click.Choice(sorted(PROTOCOLS)), default=DEFAULT_PROTOCOL,
              show_default=True, help="tools: OpenAI tool calls; text: one ```bash block per turn.")
@click.option("--run-id", default=None, help="Run id for X-Fak-Conversation (default: output folder name).")
@click.option("--exec-timeout", type=float, default=60.0, show_default=True, help="bash timeout, seconds.")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--max-tokens", type=int, default=1024, show_default=True, help="Per model turn.")
@click.option("--observation-window", type=int, default=0, show_default=True,
              help="Cut tool outputs older than N turns in what is sent (0: keep all).")
@click.option("--keep-workspaces", is_flag=True, help="Keep each instance's clone under OUTPUT/workspaces.")
@click.option("--task-env", is_flag=True,
              help="bash runs in the task's own Python env (venv per repo/version from the harness "
                   "specs, the repo installed; needs PyPI at set-up).")
@click.option("--envs", "envs_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Env cache for --task-env (default ~/.cache/fak/swebench-envs).")
@click.option("--specs", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Extra harness specs JSON {repo: {version: spec}} for --task-env.")
@click.option("--live/--no-live", default=None, help="Live table (default: when on a terminal).")
def run_cmd(agent_name: str, gateway: str, model: str, dataset: str, filter_spec: str | None,
            difficulty_file: str | None, difficulty_labels: tuple[str, ...], allow_exec: bool,
            unsafe_network: bool, max_steps: int, workers: int, repos_dir: Path | None,
            output: Path, protocol: str, run_id: str | None, exec_timeout: float,
            temperature: float, max_tokens: int, observation_window: int,
            keep_workspaces: bool, task_env: bool, envs_dir: Path | None, specs: Path | None,
            live: bool | None) -> None:
    """Run the fleet agent on SWE-bench instances; writes predictions.json, trajectories and a
    summary under --output."""
    import logging

    from fak.agent.exceptions import SandboxError
    from fak.swebench.dataset import DatasetError, select
    from fak.swebench.run import Fleet, FleetConfig

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the table

    try:
        rows, labels = select(dataset, filter_spec, difficulty_file, list(difficulty_labels))
    except (DatasetError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if protocol == "text" and not allow_exec:
        raise click.UsageError("--protocol text needs --allow-exec (its only action is a shell command)")
    cfg = FleetConfig(gateway=gateway, model=model, output=output, workers=workers,
                      max_steps=max_steps, allow_exec=allow_exec, unsafe_network=unsafe_network,
                      protocol=protocol, repos_dir=repos_dir, run_id=run_id,
                      exec_timeout_s=exec_timeout,
                      sampling={"temperature": temperature, "max_tokens": max_tokens},
                      observation_window=observation_window, keep_workspaces=keep_workspaces,
                      live=live, dataset=str(dataset), labels=labels, task_env=task_env,
                      envs_dir=envs_dir)
    if specs:
        from fak.swebench.envs import register_specs

        register_specs(json.loads(specs.read_text()))
    try:
        fleet = Fleet(cfg, rows)
    except (SandboxError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    try:
        summary = fleet.run()
    except KeyboardInterrupt:
        click.echo(f"interrupted; finished results kept in {output}", err=True)
        sys.exit(130)
    t = summary["totals"]
    click.echo(f"{summary['n_finished']}/{summary['n_run']} finished "
               f"({summary['n_skipped_finished']} skipped) · exit reasons {summary['exit_reasons']} · "
               f"steps {t['steps']} · tokens {t['prompt_tokens']}+{t['completion_tokens']} · "
               f"denied {t['denied']} · {summary['wall_s']:.1f} s → {output / 'predictions.json'}")
    if summary["n_run"] and not summary["n_finished"]:
        sys.exit(1)  # nothing could run (repositories missing, gateway down): say so to scripts


@swebench.command("eval")
@click.option("--predictions", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              required=True, help="predictions.json (list of instance_id/model_name_or_path/model_patch).")
@click.option("--dataset", default=None, help="Rows as JSON/JSONL or a dataset name "
              "(default: princeton-nlp/SWE-bench_Verified).")
@click.option("--run-id", default="fak", show_default=True)
@click.option("--workers", type=int, default=1, show_default=True)
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=Path("eval"),
              show_default=True)
@click.option("--local", "local", is_flag=True, help="Grade without Docker (venv per repo/version).")
@click.option("--repos", "repos_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local mirrors DIR/OWNER/NAME (local grading).")
@click.option("--envs", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Env cache (default ~/.cache/fak/swebench-envs).")
@click.option("--specs", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Extra harness specs JSON {repo: {version: spec}} (repos swebench does not know).")
@click.option("--timeout", type=float, default=1800.0, show_default=True, help="Test run limit, seconds.")
@click.option("--unsafe-network", is_flag=True, help="Run task tests without `unshare -n`.")
@click.option("--keep-workspaces", is_flag=True, help="Keep each graded clone under OUTPUT/logs/ID.")
def eval_cmd(predictions: Path, dataset: str | None, run_id: str, workers: int, output: Path,
             local: bool, repos_dir: Path | None, envs: Path | None, specs: Path | None,
             timeout: float, unsafe_network: bool, keep_workspaces: bool) -> None:
    """Grade predictions: the official harness (Docker), or --local without Docker."""
    from fak.swebench.eval import DEFAULT_DATASET, load_predictions, run_harness

    dataset = dataset or DEFAULT_DATASET
    if not local:
        sys.exit(run_harness(predictions, dataset, run_id, workers, output, echo=click.echo))
    from fak.agent.tools import check_network_isolation
    from fak.swebench.dataset import DatasetError, load_rows
    from fak.swebench.envs import register_specs
    from fak.swebench.local import LocalGrader

    if not unsafe_network and (err := check_network_isolation()) is not None:
        raise click.ClickException(f"task tests must run without network, but `unshare -n` fails: "
                                   f"{err}; pass --unsafe-network to run them anyway")
    try:
        rows = {r["instance_id"]: r for r in load_rows(dataset)}
    except (DatasetError, OSError) as e:
        raise click.ClickException(str(e)) from None
    if specs:
        register_specs(json.loads(specs.read_text()))
    grader = LocalGrader(rows=rows, output=output, repos_dir=repos_dir, envs=envs, workers=workers,
                         timeout_s=timeout, unsafe_network=unsafe_network, run_id=run_id,
                         keep_workspaces=keep_workspaces)
    report = grader.run(load_predictions(predictions))
    for iid, d in report["instances"].items():
        click.echo(f"{iid}: {d['status']}" + (f" ({d['error']})" if d.get("error") else ""))
    click.echo(f"resolved {report['resolved_instances']}/{report['submitted_instances']} submitted "
               f"(total {report['total_instances']}, errors {report['error_instances']}, empty "
               f"{report['empty_patch_instances']}) [local grading] → {output / 'report.json'}")
