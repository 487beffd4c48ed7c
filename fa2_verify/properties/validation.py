"""Argument validators shared by the strategies, so every message reads the same.

Each raises :class:`core.errors.UsageError` naming the argument, its value
and the fix, in the manner of Hypothesis' ``internal/validation.py``.
"""

from __future__ import annotations

from typing import Collection, Iterable

from fa2_verify.core.errors import UsageError


def check_int(name: str, value: object, *, min_value: int, max_value: int | None = None) -> None:
    """``value`` is an ``int`` (not a bool) in ``[min_value, max_value]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name}={value!r} is not an integer: pass an int")
    if value < min_value:
        raise UsageError(f"{name}={value!r} is below its minimum: use {name}>={min_value}")
    if max_value is not None and value > max_value:
        raise UsageError(f"{name}={value!r} is above its maximum: use {name}<={max_value}")


def check_order(low_name: str, low: int, high_name: str, high: int) -> None:
    """``low <= high``."""
    if low > high:
        raise UsageError(f"{low_name}={low!r} is greater than {high_name}={high!r}: use {low_name}<={high_name}")


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise UsageError(f"{name}={value!r} is not a bool: pass True or False")


def check_choices(name: str, values: Iterable[str], known: Collection[str]) -> tuple[str, ...]:
    """A non-empty tuple of names, each one of ``known``."""
    if isinstance(values, str):
        raise UsageError(f"{name}={values!r} is a string: pass a list of names, e.g. [{values!r}]")
    chosen = tuple(values)
    if not chosen:
        raise UsageError(f"{name}=() is empty: pass at least one of {', '.join(sorted(known))}")
    unknown = [value for value in chosen if value not in known]
    if unknown:
        raise UsageError(f"{name} contains unknown {unknown!r}: use names from {', '.join(sorted(known))}")
    return chosen
