"""``fak swebench run`` and ``fak swebench eval`` (click), registered in ``fak.cli``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fak.agent.protocols import DEFAULT_PROTOCOL, PROTOCOLS
from fak.hub.cli import GGUF_PATH
from fak.swebench.pipeline.cli import pipeline_options, run_pipeline
from fak.terminal import printable

if TYPE_CHECKING:
    from fak.swebench.fleet import RaySettings

UNSAFE_HELP = ("Run model-written commands / task tests on this host with your privileges, "
               "without fak's sandbox (never for untrusted models; recorded in the output).")


def _unsafe_no_sandbox(unsafe_no_sandbox: bool, unsafe_network: bool) -> bool:
    """The value of --unsafe-no-sandbox (--unsafe-network is its deprecated name), with the loud
    warning it deserves."""
    if unsafe_network:
        click.echo("fak: --unsafe-network is deprecated; it means --unsafe-no-sandbox now",
                   err=True)
    unsafe = unsafe_no_sandbox or unsafe_network
    if unsafe:
        click.secho("WARNING: --unsafe-no-sandbox: commands run on this host with your "
                    "privileges and network; a model's `rm -rf ~` or `kill -1` reaches your "
                    "files and processes.", fg="red", bold=True, err=True)
    return unsafe


@click.group("swebench")
def swebench() -> None:
    """SWE-bench: run the fleet agent on instances, grade the predictions."""


@swebench.command("run")
@click.option("--agent", "agent_name", type=click.Choice(["fleet", "pipeline"]), default="fleet",
              show_default=True, help="fleet: fak's agent loop; pipeline: the staged locate → "
                                      "repair → test → rank pipeline (docs/swebench.md).")
@click.option("--gateway", default=None,
              help="A running fak serve (or other OpenAI-compatible server): HOST:PORT or a URL.")
@click.option("--gguf", type=GGUF_PATH, default=None,
              help="Serve this GGUF model with fak serve for the run (started on a free loopback "
                   "port, stopped at the end) instead of --gateway.")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="With --gguf: the engine's compute backend.")
@click.option("--n-ctx", type=click.IntRange(min=256), default=16384, show_default=True,
              help="With --gguf: context window in tokens.")
@click.option("--kv-cache-tokens", type=click.IntRange(min=16), default=None,
              help="With --gguf: KV cache tokens shared by all agents [default: n-ctx x workers].")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="With --gguf: CPU threads of the engine [default: the engine's].")
@click.option("--policy", "policy_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="With --gguf: the tool-call policy [default: the coding-agent "
                                 "policy, examples/swebench-coding-agent-policy.json].")
@click.option("--model", default=None,
              help="Model name sent to the gateway [default: the first one it lists].")
@click.option("--dataset", required=True, help="Rows as JSON/JSONL, or a Hugging Face dataset name.")
@click.option("--filter", "filter_spec", default=None,
              help="smoke | ID,ID,... | REGEX (searched in instance ids).")
@click.option("--difficulty", "difficulty_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Difficulty labels: JSON map id→label, or .meta.jsonl rows.")
@click.option("--difficulty-label", "difficulty_labels", multiple=True,
              help="Keep only these labels (repeatable; easy|medium|hard|very_hard or Verified's "
                   "own labels). Without --difficulty, the rows' own field is used.")
@click.option("--allow-exec", is_flag=True,
              help="Give the agent the bash tool (in fak's sandbox: see docs/sandbox.md).")
@click.option("--unsafe-no-sandbox", is_flag=True, help=UNSAFE_HELP)
@click.option("--unsafe-network", is_flag=True, hidden=True,
              help="Deprecated name of --unsafe-no-sandbox.")
@click.option("--max-steps", type=int, default=30, show_default=True, help="Model turns per instance.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Agents at once (shared by all instances and attempts).")
@click.option("--attempts", type=click.IntRange(min=1), default=1, show_default=True,
              help="Independent agents per instance (fleet): each with its own clone, trajectory "
                   "(trajectories/ID.aK.traj.json for attempt K >= 1) and sampling seed, so it "
                   "needs --temperature > 0. predictions.json keeps one patch per instance: the "
                   "lowest attempt that submitted a non-empty patch, else the lowest with a "
                   "non-empty patch, else attempt 0's; summary.json says which and why. A re-run "
                   "skips finished attempts; more attempts run only the new ones, fewer are "
                   "refused.")
@click.option("--repos", "repos_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder of local git mirrors DIR/OWNER/NAME (else clone from GitHub).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output folder; re-running the same folder skips finished instances "
                   "(attempts).")
@click.option("--protocol", type=click.Choice(sorted(PROTOCOLS)), default=DEFAULT_PROTOCOL,
              show_default=True, help="tools: OpenAI tool calls; text: one ```bash block per turn.")
@click.option("--tool-choice", type=click.Choice(["required", "auto"]), default=None,
              help="tools protocol: ask for a call every turn (required, the default) or let the "
                   "model choose (auto).")
@click.option("--run-id", default=None, help="Run id for X-Fak-Conversation (default: output folder name).")
@click.option("--exec-timeout", type=float, default=60.0, show_default=True, help="bash timeout, seconds.")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="Sampling temperature of the model turns (--attempts above 1 needs > 0).")
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
@click.option("--on-repeat", type=click.Choice(["resample", "tell", "run"]), default="resample",
              show_default=True,
              help="A call identical to an earlier one, no file changed since: ask the model again "
                   "at a temperature with a new seed (resample; then tell), tell it the result "
                   "would be the same without running it (tell), or run it anyway (run).")
@click.option("--repeat-resamples", type=click.IntRange(min=0), default=2, show_default=True,
              help="With --on-repeat resample: new samples per repeated turn before telling.")
@click.option("--verify-on-edit/--no-verify-on-edit", default=True, show_default=True,
              help="With --allow-exec and the tools protocol: after each edit, run the model's own "
                   "reproduction script again (its last plain `python SCRIPT.py` run of a script it "
                   "wrote) and show the output with the edit's result.")
@click.option("--live/--no-live", default=None, help="Live table (default: when on a terminal).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              help="Run the instances as Ray tasks on the cluster at ADDRESS (auto, ray://host:10001), "
                   "or with no value on a local cluster of --workers x --ray-cpus CPUs "
                   "(pip install 'fak[ray]'; docs/cluster.md).")
@click.option("--ray-cpus", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="With --ray: CPUs each instance reserves.")
@click.option("--ray-memory-mb", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --ray: memory each instance reserves, MiB (0: none declared).")
@click.option("--ray-attempts", type=click.IntRange(min=1), default=3, show_default=True,
              help="With --ray: runs of an instance at most when its worker dies.")
@pipeline_options
def run_cmd(agent_name: str, gateway: str | None, gguf: Path | None, backend: str, n_ctx: int,
            kv_cache_tokens: int | None, threads: int | None, policy_path: Path | None,
            model: str | None, dataset: str, filter_spec: str | None,
            difficulty_file: str | None, difficulty_labels: tuple[str, ...], allow_exec: bool,
            unsafe_no_sandbox: bool, unsafe_network: bool, max_steps: int, workers: int,
            attempts: int, repos_dir: Path | None,
            output: Path, protocol: str, tool_choice: str | None, run_id: str | None,
            exec_timeout: float, temperature: float, max_tokens: int, observation_window: int,
            keep_workspaces: bool, task_env: bool, envs_dir: Path | None, specs: Path | None,
            on_repeat: str, repeat_resamples: int, live: bool | None,
            verify_on_edit: bool = True, ray_address: str | None = None, ray_cpus: float = 1.0, ray_memory_mb: int = 0,
            ray_attempts: int = 3, **pipeline_opts) -> None:
    """Run the fleet agent on SWE-bench instances; writes predictions.json, trajectories and a
    summary under --output.

    The model: --gguf MODEL serves it with fak serve for the length of the run (the coding-agent
    policy loaded, its audit log and console log in --output), or --gateway HOST:PORT uses a
    server that is already running."""
    import logging

    from fak.swebench.dataset import DatasetError, select

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the table
    unsafe_no_sandbox = _unsafe_no_sandbox(unsafe_no_sandbox, unsafe_network)
    if not math.isfinite(temperature) or temperature < 0:
        # before anything runs: a NaN temperature fails every request, and the agents' "error"
        # endings would be recorded as finished
        raise click.BadParameter(f"must be a finite number >= 0, not {temperature}", param_hint="--temperature")

    try:
        rows, labels = select(dataset, filter_spec, difficulty_file, list(difficulty_labels))
    except (DatasetError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if attempts > 1:
        if agent_name != "fleet":
            raise click.UsageError("--attempts applies to --agent fleet (the pipeline has its own "
                                   "sample counts: --repair-samples and the others).")
        if ray_address is not None:
            raise click.UsageError("--ray runs one attempt per instance for now; run --attempts "
                                   "without --ray (the threaded fleet shares --workers among "
                                   "all attempts).")
    if agent_name == "pipeline":
        if ray_address is not None:
            raise click.UsageError("--ray runs the fleet agent (--agent fleet) for now.")
        return run_pipeline(gateway=gateway, gguf=gguf, backend=backend, n_ctx=n_ctx,
                            kv_cache_tokens=kv_cache_tokens, threads=threads, policy_path=policy_path,
                            model=model, rows=rows, workers=workers, repos_dir=repos_dir,
                            output=output, run_id=run_id, keep_workspaces=keep_workspaces,
                            task_env=task_env, envs_dir=envs_dir, specs=specs,
                            unsafe_no_sandbox=unsafe_no_sandbox, live=live, dataset=dataset, **pipeline_opts)
    from fak.swebench.attempts import check_attempts

    try:  # before a server starts: attempts at temperature 0, fewer than the folder holds
        check_attempts(output, attempts, temperature)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if protocol == "text" and not allow_exec:
        raise click.UsageError("--protocol text needs --allow-exec (its only action is a shell command)")
    if (gateway is None) == (gguf is None):
        raise click.UsageError("give exactly one of --gguf MODEL (fak serve started for the run) "
                               "or --gateway HOST:PORT (a running server).")
    if gguf is None and (policy_path or kv_cache_tokens or threads):
        raise click.UsageError("--policy, --kv-cache-tokens and --threads apply with --gguf; "
                               "give them to the running server instead.")
    if tool_choice is not None and protocol != "tools":
        raise click.UsageError("--tool-choice applies to --protocol tools only.")
    if task_env or specs:
        require_swebench("--task-env" if task_env else "--specs")
    from fak.swebench.fleet import RaySettings
    from fak.swebench.serve import ManagedGateway, managed_gateway

    server = ManagedGateway(gguf, output, backend=backend, n_ctx=n_ctx, policy=policy_path,
                            kv_cache_tokens=kv_cache_tokens or n_ctx * max(1, workers),
                            threads=threads) if gguf is not None else None
    with managed_gateway(server, output, live=live):
        _run_fleet(server.addr if server is not None else gateway, server, model, rows, labels,
                   output, workers, max_steps, allow_exec, unsafe_no_sandbox, protocol,
                   tool_choice, repos_dir, run_id, exec_timeout, temperature, max_tokens,
                   observation_window, keep_workspaces, live, dataset, task_env, envs_dir, specs,
                   on_repeat, repeat_resamples, attempts=attempts, verify_on_edit=verify_on_edit,
                   ray=RaySettings(ray_address, ray_cpus, ray_memory_mb * 2**20 or None,
                                   ray_attempts) if ray_address is not None else None)


def require_swebench(what: str) -> None:
    """Stop with a one-line error when the ``swebench`` package (the ``swebench`` extra) is
    missing: ``what`` names the option or command that needs it."""
    try:
        import swebench  # noqa: F401
    except ImportError:
        raise click.ClickException(f"{what} needs the swebench package (the harness specs and log "
                                   "parsers): pip install 'fak[swebench]'") from None


def _run_fleet(gateway: str, server, model: str | None, rows: list, labels: dict, output: Path,
               workers: int, max_steps: int, allow_exec: bool, unsafe_no_sandbox: bool,
               protocol: str, tool_choice: str | None, repos_dir: Path | None,
               run_id: str | None, exec_timeout: float, temperature: float, max_tokens: int,
               observation_window: int, keep_workspaces: bool, live: bool | None, dataset: str,
               task_env: bool, envs_dir: Path | None, specs: Path | None,
               on_repeat: str = "resample", repeat_resamples: int = 2, attempts: int = 1,
               ray: RaySettings | None = None, verify_on_edit: bool = True) -> None:
    """The fleet over ``rows`` (with ``ray``: as Ray tasks on the cluster at ``ray.address``, or
    on a local one of ``workers x ray.num_cpus`` CPUs), then its summary on the console."""
    from fak.agent.exceptions import SandboxError
    from fak.cluster.raycluster import RayMissing, connect
    from fak.swebench.fleet import Fleet
    from fak.swebench.instance import FleetConfig
    from fak.swebench.serve import gateway_model

    if model is None:
        model = server.model if server is not None else gateway_model(gateway)
    cfg = FleetConfig(gateway=gateway, model=model, output=output, workers=workers,
                      max_steps=max_steps, allow_exec=allow_exec,
                      unsafe_no_sandbox=unsafe_no_sandbox,
                      protocol=protocol, tool_choice=tool_choice, repos_dir=repos_dir,
                      run_id=run_id, server=server.info() if server is not None else
                      {"managed": False, "addr": gateway},
                      exec_timeout_s=exec_timeout,
                      sampling={"temperature": temperature, "max_tokens": max_tokens},
                      observation_window=observation_window, keep_workspaces=keep_workspaces,
                      live=live, dataset=str(dataset), labels=labels, task_env=task_env,
                      envs_dir=envs_dir, on_repeat=on_repeat, repeat_resamples=repeat_resamples,
                      attempts=attempts, verify_on_edit=verify_on_edit)
    if specs:
        from fak.swebench.envs import register_specs

        register_specs(json.loads(specs.read_text()))
    try:
        if ray is not None:
            connect(ray.address, num_cpus=max(1, int(workers * max(ray.num_cpus, 1))))
        fleet = Fleet(cfg, rows, ray=ray)
    except (SandboxError, ValueError, RayMissing) as e:
        raise click.ClickException(str(e)) from None
    try:
        summary = fleet.run()
    except KeyboardInterrupt:
        click.echo(f"interrupted; finished results kept in {output}", err=True)
        sys.exit(130)
    for inst in summary["instances"]:
        if inst["exit_reason"] in ("setup_error", "error") and inst.get("message"):
            name = inst["instance_id"] + (f" a{inst['attempt']}" if "attempt" in inst else "")
            click.echo(printable(f"{name}: {inst['exit_reason']} ({inst['message']})"), err=True)
    t = summary["totals"]
    preds = output / "predictions.json"
    where = f" → {preds}" if preds.is_file() else " · no predictions written"
    if attempts > 1:
        where = f" · {summary['n_predictions']} instance(s) with a prediction" + where
    click.echo(f"{summary['n_finished']}/{summary['n_run']}{' attempts' if attempts > 1 else ''} finished "
               f"({summary['n_skipped_finished']} skipped) · exit reasons {summary['exit_reasons']} · "
               f"steps {t['steps']} · tokens {t['prompt_tokens']}+{t['completion_tokens']} · "
               f"denied {t['denied']} · {summary['wall_s']:.1f} s{where}")
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
@click.option("--unsafe-no-sandbox", is_flag=True, help=UNSAFE_HELP)
@click.option("--unsafe-network", is_flag=True, hidden=True,
              help="Deprecated name of --unsafe-no-sandbox.")
@click.option("--keep-workspaces", is_flag=True, help="Keep each graded clone under OUTPUT/logs/ID.")
@click.option("--live/--no-live", default=None,
              help="Progress bar of the local grading (default: when on a terminal).")
def eval_cmd(predictions: Path, dataset: str | None, run_id: str, workers: int, output: Path,
             local: bool, repos_dir: Path | None, envs: Path | None, specs: Path | None,
             timeout: float, unsafe_no_sandbox: bool, unsafe_network: bool,
             keep_workspaces: bool, live: bool | None) -> None:
    """Grade predictions: the official harness (Docker), or --local without Docker."""
    from fak.swebench.eval import DEFAULT_DATASET, load_predictions, run_harness

    dataset = dataset or DEFAULT_DATASET
    if not local:
        sys.exit(run_harness(predictions, dataset, run_id, workers, output, echo=click.echo))
    from fak.sandbox import probe
    from fak.swebench.dataset import DatasetError, load_rows
    from fak.swebench.envs import register_specs
    from fak.swebench.local import LocalGrader

    require_swebench("fak swebench eval --local")
    unsafe_no_sandbox = _unsafe_no_sandbox(unsafe_no_sandbox, unsafe_network)
    if not unsafe_no_sandbox and not (info := probe()).ok:
        raise click.ClickException(
            f"task installs and tests run in fak's sandbox, and it cannot be made here: "
            f"{info.detail}. Install bubblewrap (apt-get install bubblewrap); "
            "--unsafe-no-sandbox runs them on this host instead")
    try:
        rows = {r["instance_id"]: r for r in load_rows(dataset)}
    except (DatasetError, OSError) as e:
        raise click.ClickException(str(e)) from None
    if specs:
        register_specs(json.loads(specs.read_text()))
    grader = LocalGrader(rows=rows, output=output, repos_dir=repos_dir, envs=envs, workers=workers,
                         timeout_s=timeout, unsafe_no_sandbox=unsafe_no_sandbox, run_id=run_id,
                         keep_workspaces=keep_workspaces)
    preds = load_predictions(predictions)
    from fak.progress import progress_bar

    n_known = sum(1 for p in preds if p["instance_id"] in rows)
    with progress_bar("grading (task envs are built on first use)", total=n_known, live=live) as bar:
        def graded(iid: str, detail: dict[str, Any]) -> None:
            bar.advance(1)
            bar.update(description=f"graded {iid}: {detail.get('status')}")

        report = grader.run(preds, on_done=graded)
    for iid, d in report["instances"].items():
        click.echo(printable(f"{iid}: {d['status']}" + (f" ({d['error']})" if d.get("error") else "")))
    if report["unknown_ids"]:
        click.echo(f"not in the dataset, not graded: {', '.join(report['unknown_ids'])}", err=True)
    n_run = len(report["instances"])
    graded = report["resolved_instances"] + report["unresolved_instances"]
    click.echo(f"resolved {report['resolved_instances']}/{report['submitted_instances']} submitted "
               f"({graded} graded of {n_run} run; errors {report['error_instances']}, empty "
               f"{report['empty_patch_instances']}) [local grading] → {output / 'report.json'}")
    # a patch that does not apply is graded (not resolved); an instance that could not be run is not
    n_err = sum(1 for d in report["instances"].values() if d["status"] == "error")
    if n_err:
        click.echo(f"fak swebench eval: {n_err} of {n_run} could not be graded "
                   "(see the lines above and each instance's log under "
                   f"{output / 'logs'})", err=True)
        sys.exit(1)


from fak.swebench.mirror import mirror_cmd

swebench.add_command(mirror_cmd)
