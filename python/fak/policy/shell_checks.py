"""The named checks, under their former module name: see :mod:`fak.policy.checks`."""

from fak.policy.checks import CHECKS, Check, CheckFn  # noqa: F401
from fak.policy.checks.files import (rm_outside_workspace, rm_recursive_force,  # noqa: F401
                                     write_outside_workspace)
from fak.policy.checks.programs import (dynamic_command, git_push,  # noqa: F401
                                        pip_install_remote, pipe_to_interpreter)
