"""At most N shape classes per property test: what a kernel that compiles per shape compiles, bounded.

A kernel that autotunes or compiles a variant per shape (a Triton
``@autotune`` keyed on the sequence lengths and head dim, ``torch.compile``)
pays seconds to minutes the first time it meets each shape, and the suite
draws a new shape per example.  ``--fa2-shape-classes N`` lets each property
test (one per dtype) draw at most N shape classes in its process; once N are
drawn, every further case is moved into one of them, the one a Hypothesis
draw picks (:meth:`ShapeClasses.admit`), keeping its own batch, heads,
scale, value generator, seed and backward mode.  A shape class
(:func:`shape_class`) is what such a kernel keys on: the dtype, the head
dim, the kind of mask (none, causal, window) and each sequence length
rounded up to a power of two (the buckets of Triton's autotune keys and of
Inductor's dynamic shapes).  A class is kept with the first case drawn in it
(its sequence lengths and mask are the ones the moved cases take).

Hypothesis needs the same draws to give the same case.  The classes of a
test only grow, up to N, and a case's class is settled the first time its
draws are seen: a class admitted stays admitted, and once N are admitted the
set no longer changes, so a draw replayed (a failure shrunk, a database
example) gives the case it gave before.  The extra draw, which class, is made
only when the set is full and shrinks toward the first class drawn.
Varlen batches and the variants a metamorphic relation derives from its case
(a causal prefix, repeated KV heads) are not moved.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import UNBOUNDED

#: ``(dtype, head_dim, mask kind, seqlen_q bucket, seqlen_k bucket)``.
ShapeClass = tuple[str, int, str, int, int]

#: The fields a case moved into a class takes from the class's first case.
SHAPE_FIELDS: tuple[str, ...] = ("seqlen_q", "seqlen_k", "head_dim", "dtype", "causal", "window_size")


def bucket(length: int) -> int:
    """``length`` rounded up to a power of two (0 stays 0)."""
    return 0 if length <= 0 else 1 << (length - 1).bit_length()


def mask_kind(spec: CaseSpec) -> str:
    """``window`` (either side bounded), ``causal`` or ``none``."""
    if tuple(spec.window_size) != (UNBOUNDED, UNBOUNDED):
        return "window"
    return "causal" if spec.causal else "none"


def shape_class(spec: CaseSpec) -> ShapeClass:
    """What a kernel compiling per shape keys on (module docstring)."""
    return (spec.dtype, spec.head_dim, mask_kind(spec), bucket(spec.seqlen_q), bucket(spec.seqlen_k))


@dataclasses.dataclass
class ShapeClasses:
    """The shape classes each property test of this process has drawn, at most ``limit`` per test."""

    limit: int
    test: str = ""
    _drawn: dict[str, dict[ShapeClass, CaseSpec]] = dataclasses.field(default_factory=dict)

    def start(self, test: str) -> None:
        """Property test ``test`` draws its cases now (its classes are kept for a later run of it)."""
        self.test = test

    def classes(self) -> list[ShapeClass]:
        """The classes the running test has drawn, in the order drawn."""
        return list(self._drawn.get(self.test, {}))

    def admit(self, spec: CaseSpec, draw: st.DrawFn) -> CaseSpec:
        """``spec`` if its class is drawn already or fewer than ``limit`` are (it is then admitted), else
        ``spec`` moved into a drawn class, picked by ``draw`` (module docstring)."""
        drawn = self._drawn.setdefault(self.test, {})
        key = shape_class(spec)
        if key in drawn or len(drawn) < self.limit:
            drawn.setdefault(key, spec)
            return spec
        first = drawn[draw(st.sampled_from(list(drawn)), label="shape class")]
        return dataclasses.replace(spec, **{name: getattr(first, name) for name in SHAPE_FIELDS})
