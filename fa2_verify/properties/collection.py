"""The property tests pytest collects: a declared property becomes one test per dtype the run draws.

Each carries the marker :data:`MARKER` (:func:`is_property`), with the
capabilities it requires.  Everything the plugin adds to a pytest run is
prefixed (``--fa2-*`` options, the ``fa2_property`` marker, the ``fa2_suite``
fixture): it loads into every pytest run of the environment, and must not
shadow a name of another test suite.
"""

from __future__ import annotations

from typing import TypeGuard

import pytest

from fa2_verify.properties import profiles
from fa2_verify.properties import options as suite_options
from fa2_verify.properties.declaration import MARKER, Property

#: The marker's line in ``pytest --markers``.
MARKER_HELP = (
    f"{MARKER}(requires=()): a property test of fa2-verify, skipped as unsupported when the kernel lacks "
    "a required capability"
)

_dtypes_key = pytest.StashKey["tuple[str, ...]"]()


def is_property(item: pytest.Item) -> TypeGuard[pytest.Function]:
    """Whether ``item`` is a property test: a function :func:`property_tests` made, carrying the marker."""
    return isinstance(item, pytest.Function) and item.get_closest_marker(MARKER) is not None


def property_tests(collector: pytest.Collector, name: str, obj: object) -> list[pytest.Function] | None:
    """A declared property (:class:`~properties.declaration.Property`) becomes one test per dtype drawn
    (``test_<property>[<dtype>]``) under the session's profile, sharing the profile's examples; ``None`` for
    anything else."""
    if not isinstance(obj, Property):
        return None
    from fa2_verify.properties.harness import build_test, shards

    options = suite_options.of(collector.config)
    if options["kernel"] is None:
        raise collector.CollectError(f"the property suite needs {suite_options.KERNEL_REQUIRED}")
    if _dtypes_key not in collector.config.stash:
        collector.config.stash[_dtypes_key] = _shard_dtypes(collector.config)
    profile = profiles.get(options["profile"])
    test_settings = profiles.settings_for(profile, database_dir=options["database_dir"])
    run_seed = collector.config.getoption("hypothesis_seed", None)
    return [
        pytest.Function.from_parent(collector, name=shard.test_name(name), callobj=build_test(obj, test_settings, shard))
        for shard in shards(obj, profile, collector.config.stash[_dtypes_key], run_seed)
    ]


def dtypes_drawn(config: pytest.Config) -> tuple[str, ...] | None:
    """The dtypes of the property tests collected (:func:`_shard_dtypes`); ``None`` before any was."""
    return config.stash.get(_dtypes_key, None)


def _shard_dtypes(config: pytest.Config) -> tuple[str, ...]:
    """The dtypes the run draws, one test per dtype (:func:`properties.harness.shards`); none where the
    kernel cannot run here or has no dtype on the device (its single test is then skipped with the reason)
    or does not load (the ``suite`` fixture then raises the usage error naming ``--fa2-kernel``)."""
    from fa2_verify.core.errors import Fa2VerifyError
    from fa2_verify.properties.inputs import drawn_dtypes
    from fa2_verify.app.targets import load_target

    options = suite_options.of(config)
    try:
        kernel = load_target(options["kernel"])
        if kernel.unavailable_reason(options["device"]) is not None:
            return ()
        return drawn_dtypes(capabilities=kernel.capabilities, device=options["device"], include=options["dtypes"])
    except Fa2VerifyError:
        return ()
