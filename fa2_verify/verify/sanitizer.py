"""``--sanitize``: a case that faulted the device, run again under ``compute-sanitizer``, names the access.

A device fault says only that some access was illegal (:mod:`verify.device_fault`).
With ``--sanitize`` (``run``, ``repro``), each case whose kernel faulted the
device (its reason holds :data:`verify.kernel_call.FAULTED`) is run again by
``fa2-verify repro`` in a subprocess under ``compute-sanitizer --tool memcheck
--print-limit 1`` (:func:`command`), and the first error it reports (what
access, in which kernel, by which thread, at which address: :func:`first_error`)
is added to the case's reason as one more line.  Without ``compute-sanitizer``
on ``PATH`` that line says so.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from typing import Any, Callable

from fa2_verify.verify.kernel_call import FAULTED
from fa2_verify.verify.results import CaseResult

#: The sanitizer's executable.
SANITIZER = "compute-sanitizer"

#: The prefix of every line the sanitizer prints.
_PREFIX = re.compile(r"^=+ ?")

#: The headline of a reported error (memcheck's access errors, and a device-side trap or assert).
_HEADLINE = re.compile(r"^(Invalid |Misaligned |Out-of-range |Malloc/Free |Program hit |Barrier error)")


def command(kernel: str, device: str, spec: dict[str, Any]) -> list[str]:
    """The sanitizer running ``fa2-verify repro`` on case ``spec`` (its JSON record) in a fresh interpreter."""
    repro = [sys.executable, "-m", "fa2_verify", "repro", "--kernel", kernel, "--device", device,
             "--case", json.dumps(spec)]  # fmt: skip
    return [SANITIZER, "--tool", "memcheck", "--print-limit", "1", *repro]


def first_error(output: str) -> str | None:
    """The first error in the sanitizer's ``output``, one line: ``Invalid __global__ write of size 4 bytes in
    KERNEL by thread (0,0,0) in block (0,0,0), address 0x... is out of bounds``; ``None`` if it reports none."""
    lines = [_PREFIX.sub("", line).strip() for line in output.splitlines() if _PREFIX.match(line)]
    start = next((index for index, line in enumerate(lines) if _HEADLINE.match(line)), None)
    if start is None:
        return None
    parts = [lines[start]]
    for line in lines[start + 1:]:
        if _HEADLINE.match(line) or not line:
            break
        if line.startswith("at ") and " in " in line:
            parts.append("in " + line.rsplit(" in ", 1)[1])
        elif line.startswith("by thread "):
            parts.append(line)
        elif line.startswith("Address "):
            parts[-1] += ", address " + line.removeprefix("Address ")
    return " ".join(parts)


def diagnosis(kernel: str, device: str, spec: dict[str, Any], *, timeout: float,
              which: Callable[[str], str | None] = shutil.which, run: Callable[..., Any] = subprocess.run) -> str:
    """One line for a case that faulted the device: the sanitizer's first error on it, or why there is none."""
    if which(SANITIZER) is None:
        return f"--sanitize: {SANITIZER} is not on PATH, so the faulting access was not located"
    try:
        completed = run(command(kernel, device, spec), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{SANITIZER}: the case did not finish within {timeout:g} s under memcheck"
    found = first_error(completed.stdout + completed.stderr)
    return f"{SANITIZER}: {found}" if found else f"{SANITIZER}: no error reported (exit status {completed.returncode})"


def sanitized(results: list[CaseResult], kernel: str, device: str, spec: dict[str, Any] | None = None, *,
              timeout: float, **tools: Any) -> list[CaseResult]:
    """``results`` with each case that faulted the device given :func:`diagnosis` as one more line of its
    reason; ``spec``, if given, is the case to run again (a packed batch, whose results are its sequences),
    else each result's own spec; one run per distinct case."""
    notes: dict[str, str] = {}
    annotated = []
    for result in results:
        if result.status == "error" and FAULTED in (result.reason or ""):
            record = spec if spec is not None else result.spec.to_dict()
            key = json.dumps(record, sort_keys=True)
            if key not in notes:
                notes[key] = diagnosis(kernel, device, record, timeout=timeout, **tools)
            result = dataclasses.replace(result, reason=f"{result.reason}\n{notes[key]}")
        annotated.append(result)
    return annotated
