"""One error type per failure class of the planner library.

Messages name the file, the field path, the value and the fix, e.g.
``topologies/x.yaml: links[3].bandwidth_gbps must be > 0 (got -1)``.
"""

import signal


class SpiderFlowError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""

    exit_code = 2


class ConfigError(SpiderFlowError):
    """A user-supplied file or argument is invalid."""


class InfeasiblePlan(SpiderFlowError):
    """No plan fits the job on the GPUs offered (memory or GPU count short)."""


class EmulatorError(SpiderFlowError):
    """Building, using or tearing down the emulated network failed (the emulator package's one
    error type; the emulator CLI prints it as one line and exits 2)."""


class EndedBySignal(SystemExit):
    """SIGTERM, or SIGHUP (a closed terminal or SSH session), while an emulation is up: raised in the
    main thread so the command unwinds (partial results written, the network torn down) and exits
    128 + the signal. Not an error: the emulator CLI says one line and passes the exit status on."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signame = signal.Signals(signum).name
