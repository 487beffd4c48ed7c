"""The supervised child's side of :mod:`cli.supervisor`: its status pipe, and the command run again afresh.

:data:`STATUS_FD` names the environment variable that marks the child (the
number of the pipe's write end); once the child runs the command
(:func:`cli.supervisor.run_child`) :data:`child_status_fd` holds that end.
:func:`rerun` is how a command whose kernel lost the device goes on in a fresh
process (:mod:`verify.continuation`).  It sits below both :mod:`cli.main` and
:mod:`cli.supervisor`, so that neither imports the other back.
"""

from __future__ import annotations

import os
import sys

#: The environment variable that marks the child: the number of the pipe's write end.
STATUS_FD = "FA2_VERIFY_STATUS_FD"

#: The child's end of the status pipe, once :func:`cli.supervisor.run_child` runs: this process is the
#: supervised child.
child_status_fd: list[int] = []


def rerun(argv: list[str], environment: dict[str, str]) -> int:
    """The command line ``argv`` run again in a fresh process, ``environment`` added to its environment.

    In the supervised child this process becomes the fresh one (:mod:`cli.supervisor`'s
    docstring) and this call does not return; called otherwise (:func:`cli.main.main`
    from Python), it runs ``python -m fa2_verify ARGV``, supervised, and returns its status.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if child_status_fd:
        status_fd = child_status_fd[-1]
        os.set_inheritable(status_fd, True)
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
                  {**os.environ, **environment, STATUS_FD: str(status_fd)})
    import subprocess

    return subprocess.run([sys.executable, "-m", "fa2_verify", *argv], env={**os.environ, **environment}).returncode
