"""Command-line arguments that several commands share, and the parsing of their values.

``--kernel``, ``--device``, ``--max-golden-seconds``, ``--call-timeout``
(every command that runs cases), ``--sanitize`` (``run``, ``repro``),
``--corpus`` and ``--golden-cache`` (``baseline``, ``gate``, ``corpus``);
a ``--case`` JSON spec and a ``--dtypes`` list, each a one-line
:class:`~core.errors.UsageError` when bad.
"""

from __future__ import annotations

import pathlib

from fa2_verify.app.cases.gate_corpus import DEFAULT_PATH
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import UsageError
from fa2_verify.core.user_json import parse_json
from fa2_verify.core.varlen import spec_from_dict
from fa2_verify.golden.options import CACHE_ENV, DEFAULT_CACHE_DIR
from fa2_verify.verify.golden_time import DEFAULT_MAX_SECONDS, positive_seconds
from fa2_verify.verify.watchdog import DEFAULT_CALL_TIMEOUT


def add_target_arguments(parser) -> None:
    """``--kernel``, ``--device``, ``--max-golden-seconds`` and ``--call-timeout``, shared by every command
    that runs cases (``run``, ``repro``, ``race``, ``baseline``, ``gate``)."""
    parser.add_argument("--kernel", required=True, metavar="NAME", help="bundled short name or module:attr")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--max-golden-seconds", type=positive_seconds, default=DEFAULT_MAX_SECONDS, metavar="S",
        help="refuse, before any case runs, a case whose golden and comparison are estimated to take longer "
        f"(default {DEFAULT_MAX_SECONDS:g})",
    )
    parser.add_argument(
        "--call-timeout", type=positive_seconds, default=DEFAULT_CALL_TIMEOUT, metavar="SECONDS",
        help="end the command (status 1, naming the call and its case) when one kernel call runs longer, "
        f"as a hung GPU kernel does (default {DEFAULT_CALL_TIMEOUT:g})",
    )


def add_sanitize_argument(parser) -> None:
    """``--sanitize`` (``run``, ``repro``): :mod:`verify.sanitizer`."""
    parser.add_argument(
        "--sanitize", action="store_true",
        help="run a case that faults the device again under compute-sanitizer memcheck and name its first error",
    )


def add_corpus_option(parser) -> None:
    """``--corpus FILE``, for every command that reads the gate corpus (``corpus``, ``baseline``, ``gate``)."""
    parser.add_argument(
        "--corpus",
        type=pathlib.Path,
        default=DEFAULT_PATH,
        metavar="FILE",
        help="gate corpus (default: the bundled app/cases/gate.json)",
    )


def add_corpus_arguments(parser) -> None:
    """``--corpus`` and ``--golden-cache``, shared by ``fa2-verify baseline`` and ``fa2-verify gate``."""
    add_corpus_option(parser)
    parser.add_argument(
        "--golden-cache",
        type=pathlib.Path,
        metavar="DIR",
        help=f"golden cache directory (default: ${CACHE_ENV}, else {DEFAULT_CACHE_DIR})",
    )


def parse_case(text: str) -> CaseSpec:
    """The :class:`CaseSpec` (a packed batch's :class:`~core.varlen.VarlenSpec`) in ``text`` (JSON), or a
    one-line :class:`UsageError`."""
    record = parse_json(text, "--case")
    try:
        return spec_from_dict(record)
    except UsageError as exc:
        raise UsageError(f"--case: {exc}") from None


def parse_dtypes(text: str | None) -> tuple[str, ...] | None:
    """``"float16,bfloat16"`` -> ``("bfloat16", "float16")``; ``None`` stays ``None``."""
    if text is None:
        return None
    names = tuple(sorted({name.strip() for name in text.split(",") if name.strip()}))
    if not names:
        raise UsageError(f"--dtypes={text!r} names no dtype: pass e.g. --dtypes float16,bfloat16")
    return names
