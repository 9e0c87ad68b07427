"""The pipeline's options of ``fak swebench run`` and the run itself (``--agent pipeline``).

``pipeline_options`` adds the pipeline's own flags to the ``run`` command (they arrive as
keyword arguments named ``pl_*``); ``run_pipeline`` is called by ``run`` with the shared ones.
Defaults are the per-stage budgets of ``config.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def _defaults() -> dict[str, Any]:
    from fak.swebench.pipeline.choose import ChooseConfig
    from fak.swebench.pipeline.repair import RepairConfig
    from fak.swebench.pipeline.reproduce import ReproduceConfig
    from fak.swebench.pipeline.testing import TestConfig

    return {"choose": ChooseConfig(), "repair": RepairConfig(), "reproduce": ReproduceConfig(),
            "test": TestConfig()}


def pipeline_options(fn: Callable) -> Callable:
    """Decorate ``run`` with the pipeline's flags (``--stages``, budgets, ``--hints``, ...)."""
    d = _defaults()
    ch, rp, rr, te = d["choose"], d["repair"], d["reproduce"], d["test"]
    opts = [
        click.option("--stages", "pl_stages", default=None, metavar="LIST",
                     help="pipeline: stages to run, comma-separated: locate,choose,repair,"
                          "reproduce,test,rank (gen = the first four, exec = test,rank) "
                          "[default: all]; finished stages are reused."),
        click.option("--chat-template", "pl_chat_template",
                     type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="pipeline with --gateway: the model's chat template (a .gguf or a Jinja "
                          "file), to send raw prompts with a pre-filled answer to /v1/completions "
                          "[default with --gguf: its own template; else chat completions]."),
        click.option("--prompt-mode", "pl_prompt_mode", type=click.Choice(["auto", "completions", "chat"]),
                     default="auto", show_default=True,
                     help="pipeline: completions (chat template + pre-filled answer) or chat."),
        click.option("--concurrency", "pl_concurrency", type=click.IntRange(min=1), default=8,
                     show_default=True, help="pipeline: model requests in flight per instance."),
        click.option("--hints", "pl_hints", is_flag=True,
                     help="pipeline: show the issue thread's hints_text too (off: the issue only)."),
        click.option("--choose-samples", "pl_choose_samples", type=click.IntRange(min=1),
                     default=ch.samples, show_default=True,
                     help="pipeline: votes for the file, and per file for the function."),
        click.option("--max-locations", "pl_max_locations", type=click.IntRange(min=1),
                     default=ch.max_locations, show_default=True,
                     help="pipeline: locations repaired per instance."),
        click.option("--repair-samples", "pl_repair_samples", type=click.IntRange(min=1),
                     default=rp.samples, show_default=True,
                     help="pipeline: edit samples per location and form (the first greedy)."),
        click.option("--repair-forms", "pl_repair_forms", default=",".join(rp.forms),
                     show_default=True, metavar="LIST",
                     help="pipeline: answer forms of repair, comma-separated: search_replace "
                          "(SEARCH/REPLACE blocks), rewrite (the whole region rewritten)."),
        click.option("--repair-max-tokens", "pl_repair_max_tokens", type=click.IntRange(min=16),
                     default=rp.max_tokens, show_default=True),
        click.option("--repro-samples", "pl_repro_samples", type=click.IntRange(min=0),
                     default=rr.samples, show_default=True,
                     help="pipeline: reproduction scripts asked for (0: none)."),
        click.option("--repro-max-tokens", "pl_repro_max_tokens", type=click.IntRange(min=16),
                     default=rr.max_tokens, show_default=True),
        click.option("--sample-temperature", "pl_temperature", type=click.FloatRange(0.0, 2.0),
                     default=rp.temperature, show_default=True,
                     help="pipeline: temperature of every sample but the first (greedy)."),
        click.option("--test-candidates", "pl_test_candidates", type=click.IntRange(min=0),
                     default=te.candidates, show_default=True,
                     help="pipeline: candidates whose regression tests run (the best of those "
                          "the reproduction scripts ran on: most fixed, then most votes)."),
        click.option("--test-repro-candidates", "pl_test_repro_candidates",
                     type=click.IntRange(min=0), default=te.repro_candidates, show_default=True,
                     help="pipeline: candidates the kept reproduction scripts run on "
                          "(most votes first)."),
        click.option("--test-timeout", "pl_test_timeout", type=click.FloatRange(min=1.0),
                     default=te.timeout_s, show_default=True,
                     help="pipeline: seconds per regression test run."),
        click.option("--test-budget", "pl_test_budget", type=click.FloatRange(min=1.0),
                     default=te.budget_s, show_default=True,
                     help="pipeline: wall seconds of the test stage per instance; the runs that "
                          "do not fit are cut (recorded in test.jsonl and the summary) and rank "
                          "goes on with the evidence gathered."),
        click.option("--test-candidate-limit", "pl_test_candidate_limit",
                     type=click.FloatRange(min=1.0), default=te.candidate_limit_s,
                     show_default=True,
                     help="pipeline: seconds one candidate's kept scripts may take together; "
                          "also the least a candidate's run of a test file may take (else "
                          "4x the file's run on the original code) before it is a timeout."),
        click.option("--rank-select", "pl_rank_select", type=click.Choice(["behaviour", "order"]),
                     default="behaviour", show_default=True,
                     help="pipeline: how rank chooses: behaviour (clusters of candidates by their "
                          "scripts' outcomes and regression tests, scripts weighed by how they "
                          "separate candidates, then cluster size, then diff size) or order "
                          "(scripts fixed, regressions, votes, diff size)."),
        click.option("--test-workers", "pl_test_workers", type=click.IntRange(min=1),
                     default=None,
                     help="pipeline: test runs at once per instance, each in its own copy of "
                          "the work tree [default: the cores shared by --workers instances, "
                          "at most 8]."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _template(gguf: Path | None, chat_template: Path | None, mode: str) -> tuple[Any, str | None]:
    from fak.swebench.pipeline.sampler import load_template

    if mode == "chat":
        return None, None
    source = chat_template or gguf
    if source is None:
        if mode == "completions":
            raise click.UsageError("--prompt-mode completions needs --gguf or --chat-template")
        return None, None
    try:
        return load_template(source), source.name
    except Exception as e:  # noqa: BLE001 - unreadable file, no template in it
        if mode == "completions":
            raise click.ClickException(f"no chat template from {source}: {e}") from None
        return None, None


def run_pipeline(*, gateway: str | None, gguf: Path | None, backend: str, n_ctx: int,
                 kv_cache_tokens: int | None, threads: int | None, policy_path: Path | None,
                 model: str | None, rows: list, workers: int, repos_dir: Path | None,
                 output: Path, run_id: str | None, keep_workspaces: bool, task_env: bool,
                 envs_dir: Path | None, specs: Path | None, unsafe_no_sandbox: bool,
                 live: bool | None, dataset: str, **opts: Any) -> None:
    """``fak swebench run --agent pipeline``: the stages asked for, over ``rows``."""
    import json

    from fak.swebench.pipeline.config import MODEL_STAGES, PipelineConfig, parse_stages

    try:
        stages = parse_stages(opts["pl_stages"])
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    needs_model = bool(set(stages) & MODEL_STAGES)
    if gateway is not None and gguf is not None:
        raise click.UsageError("give --gguf MODEL or --gateway HOST:PORT, not both")
    if needs_model and gateway is None and gguf is None:
        raise click.UsageError(f"stages {', '.join(s for s in stages if s in MODEL_STAGES)} ask "
                               "the model: give --gguf MODEL or --gateway HOST:PORT (or run "
                               "--stages locate,test,rank without one)")
    if "test" in stages and not unsafe_no_sandbox:
        from fak.sandbox import probe

        if not (info := probe()).ok:
            raise click.ClickException(f"the test stage runs model-written scripts and the task's "
                                       f"tests in fak's sandbox, and it cannot be made here: "
                                       f"{info.detail}; --unsafe-no-sandbox runs them on this host")
    if specs:
        from fak.swebench.envs import register_specs

        register_specs(json.loads(specs.read_text()))
    template, template_source = _template(gguf, opts["pl_chat_template"], opts["pl_prompt_mode"])
    from fak.swebench.serve import ManagedGateway, gateway_model, managed_gateway

    server = None
    if gguf is not None and needs_model:
        server = ManagedGateway(gguf, output, backend=backend, n_ctx=n_ctx, policy=policy_path,
                                kv_cache_tokens=kv_cache_tokens or n_ctx * max(4, workers),
                                threads=threads,
                                max_concurrency=max(64, workers * opts["pl_concurrency"]))
    with managed_gateway(server, output, live=live):
        if server is not None:
            gateway = server.addr
        if gateway is not None and model is None:
            model = server.model if server is not None else gateway_model(gateway)
        cfg = _config(PipelineConfig, opts, output=output, stages=stages, gateway=gateway,
                      model=model, template=template, template_source=template_source,
                      repos_dir=repos_dir, workers=workers, task_env=task_env, envs_dir=envs_dir,
                      unsafe_no_sandbox=unsafe_no_sandbox, keep_workspaces=keep_workspaces, live=live,
                      run_id=run_id, dataset=str(dataset),
                      server=server.info() if server is not None else
                      ({"managed": False, "addr": gateway} if gateway else None))
        _run(cfg, rows, output)


def _config(cls: type, opts: dict[str, Any], **kw: Any) -> Any:
    cfg = cls(**kw, hints=opts["pl_hints"], concurrency=opts["pl_concurrency"])
    t = opts["pl_temperature"]
    cfg.choose.samples = opts["pl_choose_samples"]
    cfg.choose.max_locations = opts["pl_max_locations"]
    cfg.choose.temperature = t
    cfg.repair.samples = opts["pl_repair_samples"]
    cfg.repair.max_tokens = opts["pl_repair_max_tokens"]
    forms = tuple(f.strip() for f in opts["pl_repair_forms"].split(",") if f.strip())
    from fak.swebench.pipeline.repair import FORMS

    if not forms or any(f not in FORMS for f in forms):
        raise click.UsageError(f"--repair-forms takes {', '.join(FORMS)}, not {opts['pl_repair_forms']!r}")
    cfg.repair.forms = forms
    cfg.repair.temperature = t
    cfg.reproduce.samples = opts["pl_repro_samples"]
    cfg.reproduce.max_tokens = opts["pl_repro_max_tokens"]
    cfg.reproduce.temperature = t
    cfg.test.candidates = opts["pl_test_candidates"]
    cfg.test.repro_candidates = opts["pl_test_repro_candidates"]
    cfg.test.timeout_s = opts["pl_test_timeout"]
    cfg.test.budget_s = opts["pl_test_budget"]
    cfg.test.candidate_limit_s = opts["pl_test_candidate_limit"]
    cfg.rank.method = opts.get("pl_rank_select") or "behaviour"
    from fak.swebench.pipeline.testing import default_workers

    cfg.test.workers = opts["pl_test_workers"] or default_workers(cfg.workers)
    return cfg


def _run(cfg: Any, rows: list, output: Path) -> None:
    from fak.swebench.pipeline.runner import PipelineRun

    run = PipelineRun(cfg, rows)
    try:
        summary = run.run()
    except KeyboardInterrupt:
        click.echo(f"interrupted; finished stages kept in {output / 'pipeline'}", err=True)
        sys.exit(130)
    t = summary["stage_totals"]
    used = ", ".join(f"{s} {v['ran']} ran/{v['reused']} reused {v['seconds']:.0f}s "
                     f"{int(v['prompt_tokens'])}+{int(v['completion_tokens'])} tok"
                     for s, v in t.items() if v["ran"] or v["reused"])
    click.echo(f"pipeline: {summary['results']} · {used} · {summary['wall_s']:.1f} s"
               + (f" → {output / 'predictions.json'}" if "rank" in cfg.stages else ""))
    if summary["n_selected"] and not summary["results"].get("done"):
        sys.exit(1)
