"""The ``fak`` command. Each sub-command lives in its own module and registers itself here."""

from __future__ import annotations

import click

from fak import __version__
from fak.inspect_model import inspect_command
from fak.synth.cli import synth_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fak")
def main() -> None:
    """fak: a coding model served from fak's own kernels, its coding agent, and a tool-call policy."""


from fak.cli_generate import chat, generate  # noqa: E402
from fak.cluster.cli import router_cmd  # noqa: E402
from fak.doctor import doctor  # noqa: E402
from fak.gateway.cli import serve  # noqa: E402
from fak.hub.cli import pull_command  # noqa: E402
from fak.report.cli import report_command  # noqa: E402
from fak.sandbox.cli import sandbox  # noqa: E402
from fak.swebench.cli import swebench  # noqa: E402 - sub-commands register after the group

main.add_command(generate)
main.add_command(chat)
main.add_command(inspect_command)
main.add_command(synth_command)
main.add_command(swebench)
main.add_command(doctor)
main.add_command(serve)
main.add_command(sandbox)
main.add_command(router_cmd)
main.add_command(pull_command)
main.add_command(report_command)

if __name__ == "__main__":  # pragma: no cover
    main()
