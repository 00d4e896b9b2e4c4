"""``python -m emulator report RUN_DIR``: report.md and figures from a calibrate run directory.

No root and no network: it reads what ``emulator calibrate`` wrote (format in
docs/calibration.md), re-fits the microbenchmarks, writes ``fits.json``,
``figures/*.png`` (and ``.pdf``) and ``report.md`` into RUN_DIR, and prints the report's
path and its MAPE line. matplotlib is imported only when this runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write report.md and figures from an `emulator calibrate` run directory (no root needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="directory written by `emulator calibrate`")


def main(args: argparse.Namespace) -> int:
    from emulator.calibrate.report import mape_summary, write_report

    path = write_report(Path(args.run_dir))
    print(path)
    print(mape_summary(Path(args.run_dir)))
    return 0
