"""The ``fa2-verify`` command line.

Each subcommand lives in its own module under :mod:`cli.commands` and
exposes ``add_parser(subparsers)`` (registering itself with
``set_defaults(handler=...)``).  A :class:`~core.errors.Fa2VerifyError` is
printed as one line and exits 2; a kernel that fails verification exits 1.
A Ctrl-C stops the run with one line and status 130 (128 + SIGINT, the
shell's convention); a ``KeyboardInterrupt`` or ``SystemExit`` raised by the
kernel itself never gets here (:mod:`verify.user_code`).  The installed command
runs :func:`main` in a child process that must report its status, so that a kernel that
ends the process some other way cannot end the command with status 0
(:mod:`cli.supervisor`; ``python -m fa2_verify``).  A case loop whose kernel faulted the device
(:class:`~verify.continuation.DeviceFaulted`) goes on in a fresh process
with the cases done carried over (:mod:`verify.continuation`), after one
line on stderr naming the case and the fault.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fa2_verify.cli.child import rerun
from fa2_verify.core.errors import Fa2VerifyError
from fa2_verify.verify import continuation

#: Exit status after a Ctrl-C: 128 + SIGINT.
INTERRUPTED = 130

#: Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "fa2_verify.cli.commands.kernels",
    "fa2_verify.cli.commands.run",
    "fa2_verify.cli.commands.repro",
    "fa2_verify.cli.commands.race",
    "fa2_verify.cli.commands.baseline",
    "fa2_verify.cli.commands.gate",
    "fa2_verify.cli.commands.corpus",
    "fa2_verify.cli.commands.report",
    "fa2_verify.cli.commands.bench",
    "fa2_verify.cli.commands.suite",
    "fa2_verify.cli.commands.warmup",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, reporting a bad argument in one line (status 2, as every usage error here).

    argparse prints its whole usage block before the error; the usage is what
    ``--help`` is for, so the one line names the problem and points there.
    Subcommand parsers are of the same class (``add_subparsers`` makes them so).
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fa2-verify",
        description="Verify FlashAttention-2 kernels against a high-precision mpmath golden.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        with continuation.carried_over():
            return int(args.handler(args) or 0)
    except continuation.DeviceFaulted as fault:
        print(f"fa2-verify: {fault}; the cases after it run in a fresh process", file=sys.stderr)
        return rerun(argv, {continuation.ENV: str(fault.save())})
    except Fa2VerifyError as exc:
        print(f"fa2-verify: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fa2-verify: interrupted: nothing was verified to completion", file=sys.stderr)
        return INTERRUPTED

