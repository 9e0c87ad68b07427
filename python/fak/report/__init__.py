"""`fak report RUN_DIR`: one self-contained HTML page of a `fak swebench run` folder (summary,
grading, plots, a sortable table of instances, a page per instance with its trajectory or
pipeline stages and its patch). ``write_report(run_dir)`` writes it; ``load_run`` reads a run."""

from fak.report.build import render_report, write_report
from fak.report.load import Instance, RunData, RunFolderError, load_run

__all__ = ["Instance", "RunData", "RunFolderError", "load_run", "render_report", "write_report"]
