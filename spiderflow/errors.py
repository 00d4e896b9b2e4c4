"""One error type per failure class of the planner library.

Messages name the file, the field path, the value and the fix, e.g.
``topologies/x.yaml: links[3].bandwidth_gbps must be > 0 (got -1)``.
"""


class SpiderFlowError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""

    exit_code = 2


class ConfigError(SpiderFlowError):
    """A user-supplied file or argument is invalid."""


class InfeasiblePlan(SpiderFlowError):
    """No plan fits the job on the GPUs offered (memory or GPU count short)."""
