"""Atomic report writes (:func:`core.atomic.write_bytes_atomic`), with report errors a user can act on.

An existing report is never clobbered unless overwriting was asked for.
"""

from __future__ import annotations

import os
import pathlib

from fa2_verify.core.atomic import write_bytes_atomic
from fa2_verify.core.errors import ReportError


def write_text_atomic(path: str | os.PathLike[str], text: str, *, overwrite: bool) -> pathlib.Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path.

    Raises :class:`~core.errors.ReportError` if ``path`` exists and
    ``overwrite`` is False, or if its directory cannot be created or written.
    """
    target = pathlib.Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(target, text.encode("utf-8"), overwrite=overwrite)
    except FileExistsError:
        raise ReportError(
            f"{target} exists: pass --overwrite to replace it, or choose another --report directory"
        ) from None
    except OSError as exc:
        raise ReportError(f"cannot write {target}: {exc.strerror or exc}") from exc
