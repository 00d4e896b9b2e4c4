"""The emulator's one error type.

Messages name what failed, the value and the fix, like the planner's
``ConfigError``; the CLI prints them as one line and exits 2.
"""

from spiderflow.errors import SpiderFlowError


class EmulatorError(SpiderFlowError):
    """Building, using or tearing down the emulated network failed."""

    exit_code = 2
