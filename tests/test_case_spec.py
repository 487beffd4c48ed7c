"""Every field of a case spec is validated once, in ``CaseSpec``, with a one-line ``field=value: reason`` error.

The same validation serves ``repro --case``, ``corpus add``, corpus loading
(and so baselines and the gate) and the property suite, because each of them
builds its specs through :class:`~fa2_verify.core.case.CaseSpec`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fa2_verify.cli import main as cli
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import UsageError
from fa2_verify.core.varlen import VarlenSpec, spec_from_dict
from fa2_verify.app.cases.gate_corpus import load_corpus, save_corpus

GOOD = CaseSpec(batch=1, seqlen_q=5, seqlen_k=7, heads_q=4, heads_kv=2, head_dim=8, dtype="float32", name="good")


def spec_with(**changes) -> dict:
    return {**GOOD.to_dict(), **changes}


@pytest.mark.parametrize(
    "record, message",
    [
        pytest.param(spec_with(batch=0), "batch=0: must be an integer >= 1", id="batch-zero"),
        pytest.param(spec_with(batch=1.0), "batch=1.0: must be an integer", id="batch-float"),
        pytest.param(spec_with(seqlen_q=True), "seqlen_q=True: must be an integer", id="seqlen_q-bool"),
        pytest.param(spec_with(seqlen_k=-1), "seqlen_k=-1: must be an integer >= 0", id="seqlen_k-negative"),
        pytest.param(spec_with(heads_q="4"), "heads_q='4': must be an integer", id="heads_q-string"),
        pytest.param(spec_with(heads_kv=False), "heads_kv=False: must be an integer", id="heads_kv-bool"),
        pytest.param(spec_with(heads_kv=3), "heads_q=4: not a multiple of heads_kv=3", id="heads-not-multiple"),
        pytest.param(spec_with(head_dim=None), "head_dim=None: must be an integer", id="head_dim-null"),
        pytest.param(spec_with(dtype="float8"), "dtype='float8': must be one of", id="dtype-unknown"),
        pytest.param(spec_with(dtype=16), "dtype=16: must be one of", id="dtype-number"),
        pytest.param(spec_with(causal="yes"), "causal='yes': must be true or false", id="causal-string"),
        pytest.param(spec_with(causal=1), "causal=1: must be true or false", id="causal-int"),
        pytest.param(
            spec_with(window_size=["a", "b"]),
            "window_size=['a', 'b']: must be a (left, right)",
            id="window-strings",
        ),
        pytest.param(spec_with(window_size=[3]), "window_size=[3]: must be a (left, right)", id="window-one-side"),
        pytest.param(
            spec_with(window_size=[-2, 0]),
            "window_size=[-2, 0]: must be a (left, right)",
            id="window-below-minus-1",
        ),
        pytest.param(
            spec_with(window_size=[1.5, 0]),
            "window_size=[1.5, 0]: must be a (left, right)",
            id="window-float",
        ),
        pytest.param(
            spec_with(window_size=[True, 0]),
            "window_size=[True, 0]: must be a (left, right)",
            id="window-bool",
        ),
        pytest.param(spec_with(window_size="7,3"), "window_size='7,3': must be a (left, right)", id="window-string"),
        pytest.param(spec_with(softmax_scale=-1.0), "softmax_scale=-1.0: must be finite and > 0", id="scale-negative"),
        pytest.param(spec_with(softmax_scale=0.0), "softmax_scale=0.0: must be finite and > 0", id="scale-zero"),
        pytest.param(spec_with(softmax_scale="x"), "softmax_scale='x': must be a number > 0", id="scale-string"),
        pytest.param(spec_with(softmax_scale=float("inf")), "softmax_scale=inf: must be finite", id="scale-inf"),
        pytest.param(spec_with(softmax_scale=float("nan")), "softmax_scale=nan: must be finite", id="scale-nan"),
        pytest.param(spec_with(softmax_scale=True), "softmax_scale=True: must be a number", id="scale-bool"),
        pytest.param(spec_with(softmax_scale=1e300), "softmax_scale=1e+300: must be in [2**-16, 16]", id="scale-1e300"),
        pytest.param(spec_with(softmax_scale=10**400), "must be finite and > 0", id="scale-401-digits"),
        pytest.param(spec_with(softmax_scale=17), "softmax_scale=17: must be in [2**-16, 16]", id="scale-above-16"),
        pytest.param(spec_with(softmax_scale=2.0**-17), "must be in [2**-16, 16]", id="scale-below-2^-16"),
        pytest.param(spec_with(batch=2**63), f"batch={2**63}: must be an integer >= 1 and < 2**63", id="batch-2^63"),
        pytest.param(spec_with(window_size=[2**63, 0]), "window_size=[", id="window-2^63"),
        pytest.param(
            spec_with(generator="gauss"),
            "generator='gauss': is not a value generator",
            id="generator-unknown",
        ),
        pytest.param(spec_with(generator=None), "generator=None: is not a value generator", id="generator-null"),
        pytest.param(spec_with(seed="abc"), "seed='abc': must be an integer in [0, 2**64)", id="seed-string"),
        pytest.param(spec_with(seed=-1), "seed=-1: must be an integer in [0, 2**64)", id="seed-negative"),
        pytest.param(spec_with(seed=2**64), f"seed={2**64}: must be an integer in [0, 2**64)", id="seed-too-large"),
        pytest.param(spec_with(seed=1.0), "seed=1.0: must be an integer", id="seed-float"),
        pytest.param(spec_with(backward="no"), "backward='no': must be true or false", id="backward-string"),
        pytest.param(spec_with(deterministic=0), "deterministic=0: must be true or false", id="deterministic-int"),
        pytest.param(spec_with(name=3), "name=3: must be a string", id="name-number"),
        pytest.param({"batch": 1}, "lacks the required fields ['seqlen_q'", id="missing-fields"),
        pytest.param(spec_with(colour=1), "unknown fields ['colour']", id="unknown-field"),
        pytest.param([1, 2], "case spec is a list, expected a JSON object", id="not-an-object"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_field(record, message):
    with pytest.raises(UsageError) as raised:
        CaseSpec.from_dict(record)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("scale", [2.0**-16, 0.3, 16, 16.0])
def test_a_scale_in_the_range_is_accepted(scale):
    assert CaseSpec.from_dict(spec_with(softmax_scale=scale)).softmax_scale == float(scale)


@pytest.mark.parametrize("seqlens", [5, [5], [[5]], [[5, True]], [[5, -1]], [[5, 7.0]], "5,7", [[5, 7], None]])
def test_varlen_seqlens_must_be_pairs_of_lengths(seqlens):
    record = spec_with(batch=len(seqlens) if isinstance(seqlens, list) else 1, seqlens=seqlens)
    with pytest.raises(UsageError) as raised:
        spec_from_dict(record)
    assert str(raised.value).startswith(f"seqlens={seqlens!r}: must be a list of [seqlen_q, seqlen_k] pairs")


def test_valid_varlen_seqlens_build_a_packed_batch():
    spec = spec_from_dict(spec_with(batch=2, seqlens=[[5, 7], [0, 3]]))
    assert isinstance(spec, VarlenSpec) and spec.seqlens == ((5, 7), (0, 3))


def test_a_valid_spec_round_trips_and_an_integer_scale_is_taken_as_a_float():
    spec = CaseSpec.from_dict(spec_with(softmax_scale=2, window_size=[3, -1], seed=2**64 - 1))
    assert spec.softmax_scale == 2.0 and isinstance(spec.softmax_scale, float)
    assert spec.window_size == (3, -1)
    assert CaseSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize(
    "changes, field",
    [
        pytest.param({"window_size": ["a", "b"]}, "window_size=['a', 'b']", id="window"),
        pytest.param({"seed": "abc"}, "seed='abc'", id="seed"),
        pytest.param({"backward": "no"}, "backward='no'", id="backward"),
        pytest.param({"softmax_scale": -1.0}, "softmax_scale=-1.0", id="scale"),
        pytest.param({"seqlen_q": True}, "seqlen_q=True", id="bool-size"),
        pytest.param({"softmax_scale": 1e300}, "softmax_scale=1e+300", id="scale-1e300"),
        pytest.param({"seqlens": 5}, "seqlens=5", id="seqlens-not-a-list"),
    ],
)
def test_repro_and_corpus_add_refuse_a_bad_spec_in_one_line(changes, field, tmp_path, capsys):
    case = json.dumps(spec_with(**changes))
    assert cli.main(["repro", "--kernel", "reference", "--case", case]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"fa2-verify: error: --case: {field}: ") and error.count("\n") == 1
    path = save_corpus(load_corpus(), tmp_path / "gate.json")
    before = path.read_text()
    assert cli.main(["corpus", "add", "--corpus", str(path), "--case", case]) == 2
    assert f"{field}: " in capsys.readouterr().err
    assert path.read_text() == before


def test_numpy_numbers_are_taken_as_python_numbers():
    spec = CaseSpec.from_dict(
        spec_with(batch=np.int64(2), seed=np.uint64(7), window_size=[np.int32(3), -1], softmax_scale=np.float32(0.5))
    )
    assert (spec.batch, spec.seed, spec.window_size, spec.softmax_scale) == (2, 7, (3, -1), 0.5)
    assert all(type(value) in (int, float) for value in (spec.batch, spec.seed, *spec.window_size, spec.softmax_scale))
    json.dumps(spec.to_dict())


def test_the_reproduction_names_the_device_type_it_failed_on():
    """A failure on ``cuda:1`` reproduces with ``--device cuda`` (repro takes a device type); no device, no flag."""
    spec = CaseSpec(batch=1, seqlen_q=2, seqlen_k=3, heads_q=1, heads_kv=1, head_dim=8, dtype="float16")
    case = json.dumps(spec.to_dict(), sort_keys=True)
    assert spec.reproduction("triton", "cuda:1") == f"fa2-verify repro --kernel triton --device cuda --case '{case}'"
    assert spec.reproduction("triton") == f"fa2-verify repro --kernel triton --case '{case}'"
