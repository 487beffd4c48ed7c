"""The suite's Hypothesis profiles, defined in one place: ``dev``, ``ci``, ``nightly`` and ``scale``.

A profile is an example budget, a randomness policy and the shape limits
(:class:`Limits`) its cases are drawn within:

* ``dev``: a quick local run, random, with the example database so a failure
  found once is replayed first next time;
* ``ci``: derandomized (the same examples on every run, so a red build is
  reproducible), bounded to fit a 2-core CPU runner, ``print_blob=True`` so a
  failure prints its ``@reproduce_failure`` blob.  Hypothesis forbids an
  example database together with ``derandomize`` (``database=None`` is
  implied), so this profile stores nothing.  It also leaves out
  ``Phase.target``: hill-climbing on ``hypothesis.target`` pays off over
  hundreds of examples, and in a budget of tens of examples it spends most of them on
  near-copies of one case instead of new shapes;
* ``nightly``: many random examples and larger shapes, with the example
  database.  The database is set explicitly
  (``DirectoryBasedExampleDatabase``), because with ``CI`` set in the
  environment Hypothesis would otherwise load its own ``ci`` profile and drop
  the database; a CI job keeps the directory as an artifact and restores it;
* ``scale``: production shapes on a GPU (the CPU keeps the ``ci`` limits):
  lengths up to 131,072 with the long boundary values of
  :mod:`properties.shapes`, head_dim up to 256, batch x heads up to 4,096,
  each example within a budget of work (:data:`SCALE_MAX_WORK`, about 30 s of
  golden on an H100) and of device memory (:data:`SCALE_MAX_BYTES`),
  :data:`SCALE_EXAMPLES` examples per property, random, with the example
  database and ``hypothesis.target`` steering.

The property tests take their settings from :func:`settings_for`, which the
plugin calls with the session's profile when it turns the declarations into
tests, never from Hypothesis' global profile or a module-level selection, so
loading the plugin changes nothing for other test suites and import order
does not matter.  Importing this module is cheap (the plugin does it in every
pytest run); Hypothesis is imported when settings are first built.
"""

from __future__ import annotations

import dataclasses
import pathlib

from fa2_verify.properties.validation import check_int, check_order
from fa2_verify.core.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Limits:
    """Upper bounds on the shapes drawn; each profile picks its own (small on the CPU).

    ``max_work`` (``batch * heads_q * seqlen_q * seqlen_k * head_dim``, the
    cost unit of the golden and the error model) and ``max_bytes`` (device
    memory on a GPU, ``verify.memory.estimate(spec, "cuda").device``) are the per-example budget
    of a profile whose lengths alone could exceed it: a drawn case over
    budget is cut down (:func:`properties.cases.fit_budget`).  ``None``: no budget.

    ``max_seqlen`` bounds both sides of a balanced pair; below
    :data:`properties.shapes.UNBALANCED_LENGTH` (257) the strategies also draw
    unbalanced pairs, one side up to 257 and the other short enough that the
    pair has at most ``max_seqlen**2`` scores (:func:`properties.shapes.unbalanced_pairs`).

    Head dims up to ``common_head_dim`` are drawn in most examples, the larger
    ones up to ``max_head_dim`` in one example in
    :data:`properties.shapes.LARGE_HEAD_DIM_ODDS` (the golden's and the
    kernel's cost grows linearly with the head dim).  Every profile reaches
    256 on every device: kernels split head dims above 128 into chunks, and a
    chunk's bug shows nowhere else.
    """

    max_batch: int = 2
    max_heads_kv: int = 2
    max_group: int = 3
    max_seqlen: int = 80
    max_head_dim: int = 256
    common_head_dim: int = 64
    max_work: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) is not None or field.name not in ("max_work", "max_bytes"):
                check_int(field.name, getattr(self, field.name), min_value=1)
        check_order("common_head_dim", self.common_head_dim, "max_head_dim", self.max_head_dim)


@dataclasses.dataclass(frozen=True)
class Profile:
    """One profile: ``max_examples`` per property test, derandomized or not, and shape limits.

    ``targeting=False`` drops Hypothesis' target phase (hill-climbing on the
    scores passed to ``hypothesis.target``).

    ``cpu_limits`` apply on the CPU, where the mpmath golden and the kernel are
    slow; ``cuda_limits`` on a GPU.
    """

    name: str
    description: str
    max_examples: int
    derandomize: bool
    cpu_limits: Limits
    cuda_limits: Limits
    targeting: bool = True

    def limits(self, device: str) -> Limits:
        return self.cuda_limits if device.startswith("cuda") else self.cpu_limits


#: Largest work of one ``scale`` example: (1, 1, 131072, 131072, 64), a causal
#: (1, 1, 131072, 128) being half of it, whose golden takes at most 30 s on an H100.
SCALE_MAX_WORK = 2**40

#: Examples per property in ``scale``: an example takes up to about 30 s on an H100
#: (:data:`SCALE_MAX_WORK`), so 10 keep one property's search near 5 minutes at
#: worst and let a time-capped run reach more than the first property; a longer
#: search runs the profile again with another ``--hypothesis-seed`` (the example
#: database keeps what failed).
SCALE_EXAMPLES = 10

#: Device memory of one ``scale`` example: a quarter of an H100's, since a
#: metamorphic relation runs the kernel on up to a few variants of the case.
SCALE_MAX_BYTES = 20 * 10**9

_SMALL = Limits(max_batch=2, max_heads_kv=2, max_group=3, max_seqlen=72, max_head_dim=256, common_head_dim=64)
_GPU = Limits(max_batch=2, max_heads_kv=2, max_group=4, max_seqlen=160, max_head_dim=256, common_head_dim=128)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile("dev", "quick local run, random, with the example database", 15, False, _SMALL, _GPU),
        Profile(
            "ci",
            "derandomized and bounded for a 2-core CPU runner, prints the reproduction blob",
            60,
            True,
            _SMALL,
            _GPU,
            targeting=False,
        ),
        Profile(
            "nightly",
            "many random examples and larger shapes, with the example database",
            1000,
            False,
            Limits(max_batch=2, max_heads_kv=2, max_group=4, max_seqlen=136, max_head_dim=256, common_head_dim=64),
            Limits(max_batch=3, max_heads_kv=3, max_group=4, max_seqlen=300, max_head_dim=256, common_head_dim=256),
        ),
        Profile(
            "scale",
            "production shapes on a GPU (up to 131072 tokens) within a per-example budget, random, with the database",
            SCALE_EXAMPLES,
            False,
            _SMALL,
            Limits(
                max_batch=32,
                max_heads_kv=16,
                max_group=8,
                max_seqlen=131072,
                max_head_dim=256,
                common_head_dim=256,
                max_work=SCALE_MAX_WORK,
                max_bytes=SCALE_MAX_BYTES,
            ),
        ),
    )
}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(f"profile={name!r} is not a profile: use one of {', '.join(PROFILES)}") from None


def settings_for(profile: Profile, *, database_dir: pathlib.Path | None):
    """The ``hypothesis.settings`` of ``profile``; ``database_dir`` holds the example database.

    Verbosity follows Hypothesis' current default, so ``--hypothesis-verbosity``
    still works.  No deadline: one example runs the golden and the kernel,
    whose time depends on the shape drawn.
    """
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    database = None
    if not profile.derandomize and database_dir is not None:
        database = DirectoryBasedExampleDatabase(database_dir)
    default = settings.default
    assert default is not None, "Hypothesis loads its default profile before a test's settings are built"
    return settings(
        max_examples=profile.max_examples,
        derandomize=profile.derandomize,
        database=database,
        deadline=None,
        print_blob=True,
        verbosity=default.verbosity,
        phases=tuple(Phase) if profile.targeting else tuple(phase for phase in Phase if phase is not Phase.target),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
