"""``python -m emulator <subcommand>``: one parser, one error handler.

Subcommands are modules listed in :data:`SUBCOMMANDS`; each provides
``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int``. To
add one (``run``, ``calibrate``), write its module and add a line here.
Known errors (``SpiderFlowError``: a bad topology, not root, a busy lock, a
failed command) print one line and exit with their code (2); ``--debug``
shows the traceback instead. Ctrl-C exits 130, SIGTERM 143 and SIGHUP (a closed terminal or
SSH session) 129, after teardown.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from emulator import handback
from spiderflow import __version__
from spiderflow.cliutil import OneLineParser, run_main
from spiderflow.errors import EndedBySignal, SpiderFlowError

SUBCOMMANDS = {
    "calibrate": "emulator.calibrate.command",
    "check": "emulator.net.check",
    "clean": "emulator.net.clean",
    "compare": "emulator.compare",
    "report": "emulator.calibrate.report_command",
    "run": "emulator.run",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = OneLineParser(prog="python -m emulator", description="Emulated WAN for SpiderFlow (needs root).")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"spiderflow emulator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP,
                                            epilog=getattr(module, "EPILOG", None)))
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    return run_main(_main, argv)  # a closed stdout is seen after _main, once the network is torn down


def _main(argv: list[str] | None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    try:
        return modules[args.command].main(args)
    except SpiderFlowError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("interrupted; the network was torn down", file=sys.stderr)
        return 130
    except EndedBySignal as exc:
        print(f"ended by {exc.signame}; the network was torn down", file=sys.stderr)
        return exc.code
    finally:
        handback.hand_back()  # a sudo run's outputs go to the user who ran sudo (emulator/handback.py)
