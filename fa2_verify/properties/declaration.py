"""A property of the suite, declared once as data (docs/properties.md, "Adding a property").

A declaration is one function decorated with :func:`declare`::

    @declare(breaker="tests.mutants:SKIP_RESCALE")
    def test_out_within_error_model(suite, data):
        \"\"\"|out - out*| <= tau_out * B^O, elementwise (eq. 2).\"\"\"
        golden_checks.against_golden(suite, data.draw(suite.cases(), label="case"), "out")

Its name is the test's, ``test_<quantity>_<invariant>``; its docstring is the
invariant as an equation; its body draws a case from the ``suite`` with
Hypothesis' ``data`` and checks it, raising :class:`PropertyFailure` when the
invariant does not hold; ``requires`` names the capabilities it needs;
``breaker`` is the kernel target (``module:attr``) that breaks exactly this
invariant and must be caught (``tests/test_mutants_caught.py``).  The pytest
plugin turns each declaration into a Hypothesis test under the session's
profile (:func:`properties.harness.build_test`).

Importing this module is cheap: the plugin recognises declarations with it
in every pytest run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fa2_verify.properties.validation import check_choices

#: The pytest marker of a property test (its ``requires``), added by :func:`properties.harness.build_test` and
#: read by the plugin.
MARKER = "fa2_property"

#: Capabilities a property can require (attributes of core.contract.Capabilities).
REQUIREMENTS: tuple[str, ...] = (
    "backward", "deterministic_backward", "causal", "non_causal", "window", "gqa", "varlen", "lse"
)


class PropertyFailure(AssertionError):
    """The invariant does not hold on the drawn example; the message explains it and how to reproduce it."""


class MaskFailure(PropertyFailure):
    """A :class:`PropertyFailure` whose worst element lies where the case's mask fixes the exact value: a
    query row that sees no key, or a key no query sees (:func:`verify.metrics.masked_element`).

    Hypothesis tells failures apart by exception type and place, and searches
    and shrinks each apart: a kernel that attends hidden keys and also gets
    visible rows wrong is reported twice, each with its minimal case, instead
    of the first bug hiding the second.
    """


class KernelError(PropertyFailure):
    """The kernel raised on a case inside its declared capabilities (a ``CompilationError`` at a head dim it
    declares, an assertion on its tiles): what it declares and what it runs do not match.

    Each distinct error (entry point and exception type) is a subclass of its
    own (:func:`properties.kernel_errors.failure_class`), so Hypothesis
    searches and shrinks it apart from the value and mask failures, and apart
    from the kernel's other errors; ``error`` is ``(entry, exception type)``.
    """

    error: tuple[str, str] = ("", "")


class DeviceLost(BaseException):
    """The CUDA device faulted (an illegal address, say), which ends its context: every later call in the
    process raises the same error, whatever the case.  A ``BaseException``, so Hypothesis neither replays
    nor shrinks the example (each replay would fail for the lost context, not for the case, and shrinking
    would end on a meaningless minimal case); pytest reports it as the test's failure, with the case.

    The process is kept, marked as faulted (:mod:`verify.device_fault`): each later example in it ends at
    once with this error, "had faulted before this example", the kernel not called.  Ending the process
    instead would let xdist start a fresh worker, but the failing example's report could be lost with it
    (the worker exits while its report is on the way to the controller), and without xdist it would end
    the whole session; ``fa2-verify run`` is where the cases after a fault run in a fresh process."""


class DeviceOutOfMemory(BaseException):
    """The GPU had no memory left for the example.  On a GPU that several test processes share, that
    measures how full the GPU was, not how the kernel treats the case: a replay under the same pressure
    fails or passes by chance (Hypothesis's ``FlakyFailure``), and shrinking would end on whichever case
    last met a full GPU.  A ``BaseException``, as :class:`DeviceLost` is, so the example is reported as
    it is, failing, with the case and the memory free, neither replayed nor shrunk."""


@dataclasses.dataclass(frozen=True)
class Property:
    """One declared property: ``name``, ``invariant`` (an equation), ``check(suite, data)``, ``requires``, ``breaker``."""

    name: str
    invariant: str
    check: Callable[[Any, Any], None]
    breaker: str
    requires: tuple[str, ...] = ()


#: The attributes :func:`attach` gives a property test's function.
_PROPERTY_ATTRIBUTE = "fa2_property"
_DTYPE_ATTRIBUTE = "fa2_dtype"


def attach(test: Callable[..., None], prop: Property, dtype: str | None) -> None:
    """Record on ``test``, the function pytest runs for one shard of ``prop`` (:func:`properties.harness.build_test`),
    the declaration and the dtype the shard draws (``None``: every dtype), which the plugin reads back
    (:func:`attached_property`, :func:`attached_dtype`)."""
    setattr(test, _PROPERTY_ATTRIBUTE, prop)
    setattr(test, _DTYPE_ATTRIBUTE, dtype)


def attached_property(test: object) -> Property:
    """The declaration :func:`attach` recorded on ``test``."""
    prop: Property = getattr(test, _PROPERTY_ATTRIBUTE)
    return prop


def attached_dtype(test: object) -> str | None:
    """The dtype :func:`attach` recorded on ``test``."""
    dtype: str | None = getattr(test, _DTYPE_ATTRIBUTE)
    return dtype


def declare(*, breaker: str, requires: tuple[str, ...] = ()) -> Callable[[Callable[[Any, Any], None]], Property]:
    """Declare the decorated ``test_<quantity>_<invariant>(suite, data)`` as a :class:`Property`."""
    needed = check_choices("requires", requires, REQUIREMENTS) if requires else ()

    def decorate(check: Callable[[Any, Any], None]) -> Property:
        return Property(name=check.__name__, invariant=(check.__doc__ or "").strip(), check=check, breaker=breaker, requires=needed)

    return decorate
