"""The one reader of user-supplied JSON: case specs (``repro --case``, ``corpus add --case``), the
corpus (``--corpus``), baselines (``--baseline``), tolerance reports and the plugin's ``--fa2-durations``.

Every problem is one :class:`~core.errors.InputJsonError` naming the file or
option, before anything else reads the value:

* bytes are decoded as strict UTF-8 (a ``str`` from the command line must
  encode as UTF-8: non-UTF-8 bytes in ``argv`` arrive as lone surrogates);
* nesting is at most :data:`MAX_DEPTH` arrays and objects deep (the
  deepest record fa2-verify reads, a baseline, nests 5 levels; the
  standard library's parser recurses once per level and fails somewhere
  near a thousand with a ``RecursionError``);
* a number is at most :data:`MAX_NUMBER_CHARS` characters (Python refuses
  to convert an integer of more than 4300 digits; every number fa2-verify
  writes fits in 25: a 64-bit seed has 20 digits, a float's ``repr`` at
  most 24 characters) and finite (``1e999`` would parse as infinity);
* ``NaN``, ``Infinity`` and ``-Infinity`` are refused: they are not JSON.

What the value means (a case's fields, a corpus's cases, a baseline's
schema) is validated by its own reader afterwards.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
from typing import Any

from fa2_verify.core.errors import InputJsonError

#: Deepest nesting of arrays and objects accepted.
MAX_DEPTH = 64

#: Longest number literal accepted, in characters (sign, digits, point and exponent).
MAX_NUMBER_CHARS = 100

#: A JSON string literal (its escapes included), and an array or object bracket.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class _Refused(ValueError):
    """A number or constant the parse hooks refuse (turned into an :class:`InputJsonError`)."""


def _depth_exceeded(text: str) -> bool:
    """Whether arrays and objects nest deeper than :data:`MAX_DEPTH` in ``text`` (strings skipped)."""
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _short(literal: str) -> str:
    """``literal`` if it is at most :data:`MAX_NUMBER_CHARS` long."""
    if len(literal) > MAX_NUMBER_CHARS:
        raise _Refused(f"a number of {len(literal)} characters: fa2-verify reads at most {MAX_NUMBER_CHARS}")
    return literal


def _integer(literal: str) -> int:
    return int(_short(literal))


def _float(literal: str) -> float:
    value = float(_short(literal))
    if not math.isfinite(value):
        raise _Refused(f"the number {literal}, beyond float64's range")
    return value


def _constant(name: str) -> Any:
    raise _Refused(f"not valid JSON ({name} is not strict JSON)")


def parse_json(data: bytes | str, source: str) -> Any:
    """The JSON value in ``data`` (bytes, or text from an option), within the module's bounds."""
    try:
        if isinstance(data, bytes):
            text = data.decode("utf-8")
        else:
            text = data
            data.encode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        unit = "byte" if isinstance(data, bytes) else "character"
        raise InputJsonError(source, f"not UTF-8 ({exc.reason} at {unit} {exc.start})") from None
    if _depth_exceeded(text):
        raise InputJsonError(
            source, f"arrays and objects nested more than {MAX_DEPTH} levels deep: fa2-verify reads at most {MAX_DEPTH}"
        )
    try:
        return json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise InputJsonError(source, f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except _Refused as exc:
        raise InputJsonError(source, str(exc)) from None


def read_json(path: str | pathlib.Path, source: str) -> Any:
    """The JSON value of the file at ``path`` (:func:`parse_json`); an unreadable file is named too."""
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise InputJsonError(source, f"cannot read it ({exc.strerror or exc})") from None
    return parse_json(data, source)
