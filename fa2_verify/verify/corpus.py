"""The versioned gate corpus's record: a fixed list of case specs the gate runs every time.

The corpus is a JSON file (the bundled one, and its reading and writing, live in
:mod:`app.cases.gate_corpus`)::

    {"schema_version": 1, "corpus_version": 3, "cases": [CaseSpec.to_dict(), ...]}

Every case is deterministic (shape, dtype, mask, value generator and seed), so
two runs of the same kernel on it give identical error distributions and a
change in a baseline comparison is a change in the kernel, not noise
(docs/reports-and-gate.md).  Baselines record ``corpus_version`` and
:func:`Corpus.digest`; the gate refuses a baseline recorded on another corpus.

Adding a case (``fa2-verify corpus add --case JSON``, usually a counterexample
printed by a property test's reproduction line) bumps ``corpus_version``: the
baselines recorded before it must then be recorded again.  So does a change of
the values a spec names (:data:`core.values.VALUES_VERSION`, in the digest).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from fa2_verify.core import values
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import UsageError

#: Version of the corpus file layout (not of its contents: that is ``corpus_version``).
SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Corpus:
    """An ordered tuple of uniquely named case specs and the version they carry."""

    version: int
    cases: tuple[CaseSpec, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise UsageError(f"corpus_version={self.version!r} is not valid: use a positive integer")
        seen: dict[str, int] = {}
        for index, spec in enumerate(self.cases):
            if not spec.name:
                raise UsageError(f"corpus case #{index} has no name: give every corpus case a unique 'name'")
            if spec.name in seen:
                raise UsageError(f"corpus case name {spec.name!r} is used by cases #{seen[spec.name]} and #{index}")
            seen[spec.name] = index

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of the cases (order and names included) and of
        :data:`core.values.VALUES_VERSION`: a baseline recorded on other values of the same specs is refused."""
        record = {"values_version": values.VALUES_VERSION, "cases": [spec.to_dict() for spec in self.cases]}
        return "sha256:" + hashlib.sha256(_canonical(record).encode()).hexdigest()

    def dtypes(self) -> tuple[str, ...]:
        """The dtypes the corpus covers, sorted."""
        return tuple(sorted({spec.dtype for spec in self.cases}))

    def select(self, dtypes: tuple[str, ...] | None) -> tuple[CaseSpec, ...]:
        """The cases whose dtype is in ``dtypes`` (all cases when ``None``)."""
        if dtypes is None:
            return self.cases
        unknown = sorted(set(dtypes) - set(self.dtypes()))
        if unknown:
            raise UsageError(
                f"--dtypes={','.join(dtypes)}: the corpus has no {','.join(unknown)} case "
                f"(it covers {','.join(self.dtypes())})"
            )
        return tuple(spec for spec in self.cases if spec.dtype in dtypes)

    def with_case(self, spec: CaseSpec) -> Corpus:
        """A new corpus version with ``spec`` appended.

        A spec without a name is named ``cex-<first 10 hex digits of its hash>``;
        a spec equal to a corpus case up to its name is rejected.
        """
        key = _canonical({**spec.to_dict(), "name": ""})
        for existing in self.cases:
            if _canonical({**existing.to_dict(), "name": ""}) == key:
                raise UsageError(f"--case is already in the corpus as {existing.name!r}")
        if not spec.name:
            spec = dataclasses.replace(spec, name="cex-" + hashlib.sha256(key.encode()).hexdigest()[:10])
        return Corpus(version=self.version + 1, cases=self.cases + (spec,))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def corpus_from_dict(record: Any, *, source: str = "corpus") -> Corpus:
    """Validate a parsed corpus file; every problem is a one-line :class:`UsageError`."""
    if not isinstance(record, dict):
        raise UsageError(f"{source}: expected a JSON object with 'corpus_version' and 'cases'")
    if record.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(
            f"{source}: schema_version={record.get('schema_version')!r} is not supported "
            f"(this fa2-verify reads {SCHEMA_VERSION})"
        )
    cases = record.get("cases")
    if not isinstance(cases, list) or not cases:
        raise UsageError(f"{source}: 'cases' must be a non-empty list of case specs")
    specs = []
    for index, case in enumerate(cases):
        try:
            specs.append(CaseSpec.from_dict(case))
        except UsageError as exc:
            raise UsageError(f"{source}: case #{index}: {exc}") from None
    try:
        return Corpus(version=record.get("corpus_version"), cases=tuple(specs))  # type: ignore[arg-type]  # Corpus checks it
    except UsageError as exc:
        raise UsageError(f"{source}: {exc}") from None
