"""Atomic report writes (:func:`core.atomic.write_bytes_atomic`), with report errors a user can act on.

:func:`check_outputs` is called on the output paths of every command that
writes files (``run``, ``baseline``, ``gate``, ``corpus add``) before any
work starts, so a run never ends in a report it cannot write: each path must
resolve (a symlink loop is refused), pass :func:`check_writable` (no
directory, no existing file without ``--overwrite``), and differ from the
command's other outputs and from every file it reads (its inputs, also
through a symlink or a hard link: even ``--overwrite`` never replaces what
the command reads).
:func:`write_text_atomic` checks again and writes; an existing report is never
clobbered unless overwriting was asked for.  A directory output (the HTML
report) is checked by :func:`check_output_directory` and built aside
(:func:`directory_replacing`), so a failed build leaves the old one.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from fa2_verify.core.atomic import write_bytes_atomic
from fa2_verify.core.errors import ReportError


def _existing_ancestor(path: pathlib.Path) -> pathlib.Path:
    """The nearest of ``path``'s parents that exists (``mkdir`` would create the rest)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def _exists_message(target: pathlib.Path, flag: str) -> str:
    return f"{flag}={target} exists: pass --overwrite to replace it, or choose another path"


def resolved_output(target: pathlib.Path, flag: str) -> pathlib.Path:
    """``target`` made absolute with every symlink followed; a one-line :class:`ReportError` when that fails
    (a symlink loop, in ``target`` or in a parent), which would otherwise surface only at the write."""
    try:
        return target.resolve()
    except RuntimeError:  # Python < 3.13 reports a loop so
        raise ReportError(f"{flag}={target} is a symlink loop: choose another path") from None
    except OSError as exc:
        reason = "is a symlink loop" if exc.errno == errno.ELOOP else f"cannot be resolved ({exc.strerror or exc})"
        raise ReportError(f"{flag}={target} {reason}: choose another path") from None


def _resolved_input(path: pathlib.Path) -> pathlib.Path | None:
    """An input's resolved path, or None if it cannot be resolved (then it is no file an output could be)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return None


def _is_input(target: pathlib.Path, resolved: pathlib.Path, where: pathlib.Path) -> bool:
    """Whether the output ``target`` (resolved ``resolved``) is the input file ``where``: the same path once
    symlinks are followed, or the same file under another name (a hard link)."""
    if resolved == _resolved_input(where):
        return True
    try:
        return os.path.samefile(target, where)
    except OSError:  # one of them does not exist: no file is both
        return False


def check_writable(path: str | os.PathLike[str], *, overwrite: bool, flag: str) -> pathlib.Path:
    """``path`` as a :class:`pathlib.Path` if a report can be written there; else a one-line :class:`ReportError`.

    ``flag`` is the option that named the path (``--report``, ``--out``...),
    for the message.  The path must resolve (:func:`resolved_output`), must
    not be a directory, must not exist unless ``overwrite``, and its nearest
    existing parent must be a directory this process can write into.
    """
    target = pathlib.Path(path)
    resolved_output(target, flag)
    if target.is_dir():
        raise ReportError(f"{flag}={target} is a directory: name a file")
    if target.exists() and not overwrite:
        raise ReportError(_exists_message(target, flag))
    _check_creatable(target, flag)
    return target


def _check_creatable(target: pathlib.Path, flag: str) -> None:
    """A one-line :class:`ReportError` unless ``target``'s nearest existing parent is a directory this process can
    write into (so ``target`` can be created there)."""
    ancestor = _existing_ancestor(target)
    if not ancestor.is_dir():
        raise ReportError(f"{flag}={target} cannot be written: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ReportError(f"{flag}={target} cannot be written: no write permission in {ancestor}")


def check_outputs(
    outputs: dict[str, str | os.PathLike[str] | None],
    *,
    overwrite: bool,
    inputs: dict[str, str | os.PathLike[str] | None] | None = None,
) -> None:
    """The output paths of one command (``{flag: path}``, ``None`` for an output not asked for), checked before
    it does any work; the first problem is a one-line :class:`ReportError`.

    No output is one of the files the command reads (``inputs``, as ``outputs``):
    replacing it would destroy the input, which ``--overwrite`` does not ask
    for.  Then :func:`check_writable` on each, and no two of them the same file:
    the second write would replace the first, which was not asked for either.
    """
    read = {flag: pathlib.Path(path) for flag, path in (inputs or {}).items() if path is not None}
    seen: dict[pathlib.Path, tuple[str, pathlib.Path]] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        target = pathlib.Path(path)
        resolved = resolved_output(target, flag)
        for input_flag, where in read.items():
            if _is_input(target, resolved, where):
                raise ReportError(
                    f"{flag}={target} is {input_flag}={where}, which this command reads: writing it would destroy "
                    f"the input, with or without --overwrite; choose another {flag}"
                )
        check_writable(target, overwrite=overwrite, flag=flag)
        if resolved in seen:
            first_flag, first = seen[resolved]
            raise ReportError(f"{first_flag}={first} and {flag}={target} name the same file: choose different paths")
        seen[resolved] = (flag, target)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, overwrite: bool, flag: str) -> pathlib.Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path.

    Raises :class:`~core.errors.ReportError` when :func:`check_writable`
    refuses the path, or when the write itself fails.
    """
    target = check_writable(path, overwrite=overwrite, flag=flag)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(target, text.encode("utf-8"), overwrite=overwrite)
    except FileExistsError:
        raise ReportError(_exists_message(target, flag)) from None
    except OSError as exc:
        raise ReportError(f"{flag}={target} cannot be written: {exc.strerror or exc}") from exc


def check_output_directory(
    path: str | os.PathLike[str], *, overwrite: bool, flag: str, inputs: dict[str, pathlib.Path]
) -> pathlib.Path:
    """``path`` as a :class:`pathlib.Path` if a directory output (the HTML report) can replace it; else a one-line
    :class:`ReportError`.

    It must not be a file, must be empty or absent unless ``overwrite``, its
    nearest existing parent must be a writable directory, and it must hold
    neither one of ``inputs`` (``{flag: path}``, e.g. the results the report is
    made from) nor the current directory: replacing it would delete them,
    which ``--overwrite`` does not ask for.
    """
    target = pathlib.Path(path)
    resolved = resolved_output(target, flag)
    held = [(f"{name}={where}", pathlib.Path(where)) for name, where in inputs.items()]
    for label, where in [*held, ("the current directory", pathlib.Path.cwd())]:
        input_path = _resolved_input(where)
        if input_path is not None and (resolved == input_path or resolved in input_path.parents):
            raise ReportError(f"{flag}={target} holds {label}: replacing it would delete it; choose another {flag}")
    if target.exists() and not target.is_dir():
        raise ReportError(f"{flag}={target} is a file: name a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ReportError(f"{flag}={target} exists and is not empty: pass --overwrite to replace it, or choose another {flag}")
    _check_creatable(target, flag)
    return target


@contextmanager
def directory_replacing(target: pathlib.Path) -> Iterator[pathlib.Path]:
    """A path, not yet existing, in a fresh staging directory beside ``target``, to build a directory output
    at; when the block ends without an error, what was built takes ``target``'s place (an old ``target`` is
    removed only then), else the staging directory is removed and ``target`` is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    built, old = staging / "new", staging / "old"
    try:
        yield built
        if target.exists():
            target.rename(old)
        built.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
