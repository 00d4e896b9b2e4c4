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


# HiGHS's primal heuristics that search sub-MIPs or round from the root LP. On the intra-cluster
# ILP's small models (a few binaries, 10-60 integers) the proof of optimality needs few nodes, and
# these heuristics took about half of each solve: off, 182 captured problems of a simulated
# 3,000-job trace took 2.1 s of CPU instead of 3.8 s, with the same optimal objective on every one
# (another of its equal optima on 14: the layer split is then a different one of the same slowest stage).
SMALL_MIP_OPTIONS = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False,
                     "mip_heuristic_run_root_reduced_cost": False, "mip_heuristic_run_zi_round": False,
                     "mip_heuristic_run_shifting": False}


def milp_solver(*, small: bool = False):
    """PuLP's HiGHS, quiet, or CBC quietly when highspy is missing; ``small``: a model of tens of
    columns solved many times over, where HiGHS skips the heuristics of ``SMALL_MIP_OPTIONS``."""
    if not highs_available():
        return pulp.PULP_CBC_CMD(msg=False)
    return pulp.HiGHS(msg=False, **(SMALL_MIP_OPTIONS if small else {}))
