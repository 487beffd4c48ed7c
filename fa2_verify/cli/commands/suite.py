"""``fa2-verify suite``: run the Hypothesis property suite against one kernel.

Runs pytest (in a child process) on the installed :mod:`properties` package with the plugin's
options (``--kernel``, ``--device``, ``--fa2-profile``, ``--fa2-dtypes``);
every argument after ``--`` goes to pytest unchanged, e.g. ``-n 2`` or
``-k dq``.  pytest's root directory is the current directory, so the golden
cache (``.fa2-golden-cache``) and the example database (``.fa2-examples``)
land there.  Exit status: 0 when every property held, 1 when one failed,
2 for a usage error or anything else pytest reports (interrupted, internal
error, no test collected), with one line naming pytest's status, since
nothing was verified.  A pytest that exits 0 before its session finished
(the plugin writes :data:`properties.plugin.FINISHED` as it ends) was ended
by a kernel: one line, status 1.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

from fa2_verify.core.errors import Fa2VerifyError
from fa2_verify.properties import plugin, profiles

#: pytest exit codes that mean "the kernel passed" and "the kernel failed".
_PASSED, _FAILED = 0, 1


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "suite",
        help="run the property suite (Hypothesis, against the golden) on a kernel",
        description="Run the property suite on a kernel; arguments after -- go to pytest (e.g. -- -n 2 -k dq).",
    )
    parser.add_argument("--kernel", required=True, metavar="NAME", help="bundled short name or module:attr")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--profile", default="dev", choices=list(profiles.PROFILES), help="Hypothesis profile (default: dev)")
    parser.add_argument("--dtypes", metavar="LIST", help="comma-separated dtypes to draw (default: all the kernel supports)")
    parser.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help="passed to pytest unchanged")
    parser.set_defaults(handler=handle)


def pytest_arguments(args) -> list[str]:
    """The pytest command line ``args`` stand for."""
    from fa2_verify import properties
    command = [
        str(pathlib.Path(properties.__file__).parent),
        f"--rootdir={pathlib.Path.cwd()}",
        f"--fa2-kernel={args.kernel}",
        f"--fa2-device={args.device}",
        f"--fa2-profile={args.profile}",
    ]
    if args.dtypes is not None:
        command.append(f"--fa2-dtypes={args.dtypes}")
    return command + list(args.pytest_args)


#: What pytest's other exit statuses mean (``pytest.ExitCode``), for the one-line error.
_PYTEST_STATUSES = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error", 5: "no tests collected, or every property unsupported"}


def handle(args) -> int:
    with tempfile.TemporaryDirectory(prefix="fa2-verify-suite-") as directory:
        finished = pathlib.Path(directory) / "finished"
        status = subprocess.run([sys.executable, "-m", "pytest", *pytest_arguments(args)], check=False,
                                env={**os.environ, plugin.FINISHED: str(finished)}).returncode
        ended_early = not finished.exists()
    if status == _PASSED and ended_early:
        print("fa2-verify: error: pytest exited with status 0 before its session finished: a kernel ended the "
              "process; the line naming its case says where, nothing after it was verified", file=sys.stderr)
        return _FAILED
    if status in (_PASSED, _FAILED):
        return status
    meaning = _PYTEST_STATUSES.get(status, f"killed by signal {-status}" if status < 0 else "unknown status")
    raise Fa2VerifyError(f"pytest exited with status {status} ({meaning}): nothing was verified; its output above says why")
