"""`fak report RUN_DIR`: the run's report.html (fak.report)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the page [default: RUN_DIR/report.html].")
@click.option("--grading", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="The grading report (fak swebench eval's report.json) "
                                 "[default: RUN_DIR/eval/report.json or RUN_DIR/*/report.json].")
def report_command(run_dir: Path, output: Path | None, grading: Path | None) -> None:
    """Write one self-contained HTML report of a `fak swebench run` folder: the summary (and the
    grading report), plots, a sortable table of instances and a page per instance with its
    trajectory (tool calls, the policy's verdicts, observations) or pipeline stages, and its
    patch. It needs no server and no network: open it as a file. Prints the path written."""
    from fak.report import RunFolderError, write_report

    try:
        out = write_report(run_dir, output, grading)
    except ImportError as exc:  # matplotlib (the report extra) is missing
        raise click.ClickException(f"fak report needs the report extra ({exc.name} is missing): "
                                   "pip install 'fak[report]'") from exc
    except RunFolderError as exc:
        raise click.BadParameter(str(exc), param_hint="RUN_DIR") from exc
    except OSError as exc:
        raise click.ClickException(f"could not write the report: {exc}") from exc
    click.echo(str(out))
