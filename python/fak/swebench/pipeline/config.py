"""The pipeline's stages and settings (``fak swebench run --agent pipeline --help`` for each)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fak.swebench.pipeline.choose import ChooseConfig
from fak.swebench.pipeline.locate import LocateConfig
from fak.swebench.pipeline.rank import RankConfig
from fak.swebench.pipeline.repair import RepairConfig
from fak.swebench.pipeline.reproduce import ReproduceConfig
from fak.swebench.pipeline.testing import TestConfig

#: the stages in order
STAGES = ("locate", "choose", "repair", "reproduce", "test", "rank")
#: the stages that ask the model (a gateway is needed)
MODEL_STAGES = frozenset({"choose", "repair", "reproduce"})
#: what each stage reads: (stage, required)
INPUTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "locate": (),
    "choose": (("locate", True),),
    "repair": (("choose", True),),
    "reproduce": (("choose", True),),
    "test": (("repair", True), ("reproduce", False)),
    "rank": (("repair", True), ("test", False)),
}


def parse_stages(spec: str | None) -> tuple[str, ...]:
    """``"locate,repair"`` → the named stages in pipeline order; ``None``/``"all"`` → all.
    ``gen`` stands for locate..reproduce and ``exec`` for test,rank. Raises ``ValueError``."""
    if not spec or spec == "all":
        return STAGES
    names: set[str] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "gen":
            names.update(("locate", "choose", "repair", "reproduce"))
        elif part == "exec":
            names.update(("test", "rank"))
        elif part in STAGES:
            names.add(part)
        else:
            raise ValueError(f"unknown stage {part!r}; the stages are {', '.join(STAGES)} "
                             "(or gen, exec, all)")
    return tuple(s for s in STAGES if s in names)


@dataclass
class PipelineConfig:
    """One pipeline run: where (``output``, ``repos_dir``), which ``stages``, the model
    (``gateway``, ``model``, ``template``: a ``ChatTemplate`` for raw completions, else chat),
    parallelism (``workers`` instances, ``concurrency`` requests per instance), the issue shown
    (``hints``, ``issue_chars``), the per-stage budgets, and the task environment."""

    output: Path
    stages: tuple[str, ...] = STAGES
    gateway: str | None = None
    model: str | None = None
    template: Any = None
    template_source: str | None = None
    repos_dir: Path | None = None
    workers: int = 2
    concurrency: int = 8
    hints: bool = False
    issue_chars: int = 6000
    locate: LocateConfig = field(default_factory=LocateConfig)
    choose: ChooseConfig = field(default_factory=ChooseConfig)
    repair: RepairConfig = field(default_factory=RepairConfig)
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)
    test: TestConfig = field(default_factory=TestConfig)
    rank: RankConfig = field(default_factory=RankConfig)
    task_env: bool = False
    envs_dir: Path | None = None
    unsafe_no_sandbox: bool = False
    keep_workspaces: bool = False
    live: bool | None = None
    run_id: str | None = None
    dataset: str = ""
    server: dict[str, Any] | None = None

    @property
    def mode(self) -> str:
        return "completions" if self.template is not None else "chat"

    def stage_config(self, stage: str) -> dict[str, Any]:
        """What a stage's result depends on besides its inputs (part of its ``input_digest``)."""
        issue = {"hints": self.hints, "issue_chars": self.issue_chars}
        if stage == "locate":
            return {**asdict(self.locate), **issue}
        if stage == "test":  # not the workers: the same runs, verdicts and cuts aside
            return {**{k: v for k, v in asdict(self.test).items() if k != "workers"},
                    "task_env": self.task_env}
        if stage == "rank":
            return asdict(self.rank)
        sub = {"choose": self.choose, "repair": self.repair, "reproduce": self.reproduce}[stage]
        return {**asdict(sub), **issue, "model": self.model, "mode": self.mode,
                "template": self.template_source}

    def to_json(self) -> dict[str, Any]:
        return {"stages": list(self.stages), "gateway": self.gateway, "model": self.model,
                "mode": self.mode, "template": self.template_source, "workers": self.workers,
                "concurrency": self.concurrency, "hints": self.hints,
                "issue_chars": self.issue_chars, "locate": asdict(self.locate),
                "choose": asdict(self.choose), "repair": asdict(self.repair),
                "reproduce": asdict(self.reproduce), "test": asdict(self.test), "rank": asdict(self.rank),
                "task_env": self.task_env, "dataset": self.dataset, "server": self.server}
