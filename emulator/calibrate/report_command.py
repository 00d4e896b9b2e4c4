"""``python -m emulator report RUN_DIR``: report.md and figures from a calibrate run directory.

No root and no network: it reads what ``emulator calibrate`` wrote (format in
docs/calibration.md), re-fits the microbenchmarks, writes ``fits.json``,
``figures/*.png`` (and ``.pdf``) and ``report.md`` into RUN_DIR (or ``--out DIR``: a run
directory that ``sudo emulator calibrate`` made in a place root owns stays root's, and a user may
not write there; emulator/handback.py), and
prints the report's path and its MAPE line. matplotlib is imported only when this runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from emulator import handback
from spiderflow.cliutil import input_dir, output_dir

HELP = "write report.md and figures from an `emulator calibrate` run directory (no root needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", type=input_dir, help="directory written by `emulator calibrate`")
    parser.add_argument("--out", type=output_dir, metavar="DIR",
                        help="write fits.json, figures/ and report.md here (made if missing; default RUN_DIR)")


def main(args: argparse.Namespace) -> int:
    from emulator.calibrate.report import mape_summary, write_report
    from emulator.calibrate.rundir import load_run

    handback.remember(args.run_dir if args.out is None else args.out)  # under sudo: the user's again
    run = load_run(Path(args.run_dir))  # read and checked once, for the report and its MAPE line
    print(write_report(run, None if args.out is None else Path(args.out)))
    print(mape_summary(run))
    return 0
