"""Atomic report writes: a reader sees the old file or the new one, never half of one.

The text goes to a temporary file in the target's directory, which then takes
the target's name in one step: ``os.replace`` when overwriting was asked for,
else ``os.link``, which fails if the name exists, so an existing report is
never clobbered, not even by a concurrent writer.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

from fa2_verify.core.errors import ReportError


def write_text_atomic(path: str | os.PathLike[str], text: str, *, overwrite: bool) -> pathlib.Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path.

    Raises :class:`~core.errors.ReportError` if ``path`` exists and
    ``overwrite`` is False, or if its directory cannot be created or written.
    """
    target = pathlib.Path(path)
    if target.exists() and not overwrite:
        raise ReportError(f"{target} exists: pass --overwrite to replace it, or choose another --report directory")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise ReportError(f"cannot write {target}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            os.replace(temporary, target)
        else:
            os.link(temporary, target)
    except FileExistsError:
        raise ReportError(
            f"{target} exists: pass --overwrite to replace it, or choose another --report directory"
        ) from None
    except OSError as exc:
        raise ReportError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target
