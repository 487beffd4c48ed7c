"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The bytes go to a temporary file in the target's directory, created with
mode ``0o666`` less the process umask (as ``open`` creates any file, so
``0644`` under the usual ``0022``), are flushed to disk, and the file then
takes the target's name in one step: ``os.replace``
when overwriting is allowed, else ``os.link``, which fails with
:class:`FileExistsError` if the name exists, so an existing file is never
clobbered, not even by a concurrent writer.  Reports (:mod:`core.outputs`),
golden cache entries (:mod:`golden.cache`) and the property suite's
in-flight records (:mod:`properties.inflight`) are written through it.

A log that grows while a run goes on (the property suite's failures,
:mod:`properties.failure_log`) is appended to a line at a time
(:func:`append_line`): one ``write`` to a file opened with ``O_APPEND``, so
lines of concurrent writers never interleave, and a reader finds whole lines.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets

#: Mode of a new file before the umask applies, as for ``open(path, "w")``.
FILE_MODE = 0o666


def write_bytes_atomic(target: pathlib.Path, data: bytes, *, overwrite: bool, sync: bool = True) -> pathlib.Path:
    """Write ``data`` to ``target`` atomically, with the umask's mode; ``OSError`` on failure.

    ``sync=False`` skips flushing to disk: the file then survives its
    writer's death (the kernel's page cache holds it), not the machine's, and
    costs microseconds instead of an ``fsync``'s milliseconds.
    """
    temporary = target.parent / f".{target.name}.{secrets.token_hex(8)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        if overwrite:
            os.replace(temporary, target)
        else:
            os.link(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return target


def append_line(target: pathlib.Path, line: str, *, sync: bool = True) -> None:
    """Append ``line`` (a newline is added) to ``target``, created with the umask's mode if missing, in one
    ``write`` to a descriptor opened with ``O_APPEND`` (the offset moves and the bytes land in one step, so
    processes appending to one file never interleave), then ``fsync`` unless ``sync=False``; ``OSError`` on
    failure, including a short write (a full disk)."""
    data = (line.rstrip("\n") + "\n").encode()
    descriptor = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        written = os.write(descriptor, data)
        if written != len(data):
            raise OSError(f"{target}: wrote {written} of {len(data)} bytes of a line")
        if sync:
            os.fsync(descriptor)
    finally:
        os.close(descriptor)
