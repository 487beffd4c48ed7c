"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The bytes go to a temporary file in the target's directory, are flushed to
disk, and the file then takes the target's name in one step: ``os.replace``
when overwriting is allowed, else ``os.link``, which fails with
:class:`FileExistsError` if the name exists, so an existing file is never
clobbered, not even by a concurrent writer.  Reports (:mod:`verify.atomic`)
and golden cache entries (:mod:`golden.cache`) are written through it.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile


def write_bytes_atomic(target: pathlib.Path, data: bytes, *, overwrite: bool) -> pathlib.Path:
    """Write ``data`` to ``target`` atomically, readable by all (mode 0644); ``OSError`` on failure."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        if overwrite:
            os.replace(temporary, target)
        else:
            os.link(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return target
