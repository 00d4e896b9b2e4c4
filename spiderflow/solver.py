"""Which MILP solver PuLP gets: HiGHS (highspy) when installed, else CBC; one place for both ILPs.

highspy 1.16 prints a copyright banner on standard output when a process creates
its first ``Highs`` object, before any option (``output_flag``) can silence it.
That banner broke ``--json`` output (``emulator run --json``, ``spiderflow plan
--json``). :func:`highs_available` creates that first object once with standard
output pointed at standard error, so the banner stays visible there and stdout
carries only what the command prints.
"""

from __future__ import annotations

import functools
import os
import sys

import pulp


def highs_available() -> bool:
    if not pulp.HiGHS().available():
        return False
    _first_highs_to_stderr()
    return True


@functools.cache
def _first_highs_to_stderr() -> None:
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def milp_solver():
    """PuLP's HiGHS, quiet, or CBC quietly when highspy is missing."""
    return pulp.HiGHS(msg=False) if highs_available() else pulp.PULP_CBC_CMD(msg=False)
