"""The one error hierarchy of fa2-verify.

Three outcomes are kept apart (as in ``torch.testing``): a kernel that passes,
a kernel whose numbers mismatch the golden (reported through
:mod:`verify.metrics`, never raised from here), and an error in the harness or
in the user's input, which is one of the classes below.  The CLI prints an
``Fa2VerifyError`` as one line and exits with status 2; anything else is a bug
in fa2-verify and keeps its traceback.
"""


class Fa2VerifyError(Exception):
    """Base class: bad user input or an environment that cannot run the request."""


class UsageError(Fa2VerifyError):
    """A bad argument: the message names it, its value, and the fix."""


class InputJsonError(UsageError):
    """User-supplied JSON (a file or an option's value) that cannot be read, is not UTF-8, is not JSON,
    or exceeds the bounds of :mod:`core.user_json`; ``source`` names the file or option, ``problem`` what
    is wrong with it, and the message is ``"{source}: {problem}"``."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


class KernelLoadError(Fa2VerifyError):
    """A kernel target that cannot be found, imported, or lacks ``forward``."""


class UnsupportedCase(Fa2VerifyError):
    """A case outside a kernel's declared capabilities (reported as unsupported)."""


class DeviceUnavailable(Fa2VerifyError):
    """The requested device (e.g. ``cuda``) is not present on this machine."""


class CaseTooLarge(Fa2VerifyError):
    """A case whose estimated memory exceeds what its device or the host has free (``verify.memory``), or
    whose estimated golden and comparison time exceeds the limit (``verify.golden_time``)."""


class GoldenError(Fa2VerifyError):
    """The golden could not be computed or certified to its stated bound."""


class BaselineError(Fa2VerifyError):
    """A missing, corrupt or mismatched baseline; the gate fails closed on it."""


class ReportError(Fa2VerifyError):
    """A report could not be written (e.g. it exists and overwriting was not asked)."""
