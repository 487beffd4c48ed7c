"""The on-disk golden cache: hits, misses, keys, corruption and concurrent writers."""

from __future__ import annotations

import io
import os
import pathlib
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from fa2_verify import golden
from fa2_verify.golden import cache, certify, fast, mp
from fa2_verify.golden.cache import GoldenCacheWarning
from fa2_verify.golden.certify import LIMIT
from fa2_verify.golden.options import CACHE_ENV
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.errors import GoldenError, UsageError
from fa2_verify.verify.check import check_case
from fa2_verify.verify.registry import LoadedKernel
from tests.degraded import ScaledOutError

OUTPUTS = ("out", "lse", "delta", "dq", "dk", "dv")


def _inputs(seed=0, dtype=torch.float16):
    generator = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(1, 4, 2, 3, generator=generator, dtype=torch.float64).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, 5, 1, 3, generator=generator, dtype=torch.float64).to(dtype) for _ in range(2))
    return q, k, v, dout


def _compute(cache_dir, *, inputs=None, method="mpmath", **call):
    call = {"softmax_scale": 0.4, **call}
    options = golden.GoldenOptions(method=method, cache_dir=cache_dir)
    return golden.compute(*(inputs or _inputs()), **call, options=options)


def _entries(directory):
    return sorted(p.name for p in directory.iterdir())


def _assert_same(a, b):
    assert (a.method, a.certified_bound) == (b.method, b.certified_bound)
    for name in OUTPUTS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def _forbid_computing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the golden was recomputed")

    monkeypatch.setattr(mp, "attention", refuse)
    monkeypatch.setattr(fast, "attention", refuse)


@pytest.mark.parametrize("method", ["mpmath", "fast"])
def test_miss_writes_one_entry_and_hit_reads_it_without_computing(tmp_path, monkeypatch, method):
    first = _compute(tmp_path, method=method)
    assert len(_entries(tmp_path)) == 1 and _entries(tmp_path)[0].endswith(".golden")
    _forbid_computing(monkeypatch)
    second = _compute(tmp_path, method=method)
    _assert_same(first, second)


def test_no_cache_dir_and_no_environment_means_no_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    _compute(None)
    assert _entries(tmp_path) == []


def test_environment_variable_names_the_cache_when_cache_dir_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "shared"))
    first = _compute(None)
    assert len(_entries(tmp_path / "shared")) == 1
    monkeypatch.setenv(CACHE_ENV, "")
    assert golden.GoldenOptions().resolved_cache_dir() is None
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "shared"))
    _forbid_computing(monkeypatch)
    _assert_same(first, _compute(None))


@pytest.mark.parametrize(
    "change",
    [
        {"softmax_scale": 0.5},
        {"causal": True},
        {"window_size": (1, 0)},
        {"inputs": _inputs(seed=1)},
        {"inputs": tuple(t.to(torch.bfloat16) for t in _inputs())},
        {"method": "fast"},
    ],
    ids=["scale", "causal", "window", "values", "dtype", "method"],
)
def test_everything_the_golden_depends_on_is_in_the_key(tmp_path, change):
    _compute(tmp_path)
    _compute(tmp_path, **change)
    assert len(_entries(tmp_path)) == 2


def test_causal_and_the_equivalent_window_share_an_entry(tmp_path):
    """causal=True is window_size=(-1, 0): the same mask, the same golden, one entry."""
    _compute(tmp_path, causal=True)
    _compute(tmp_path, window_size=(-1, 0))
    assert len(_entries(tmp_path)) == 1


def test_precision_and_certify_rows_are_in_the_key(tmp_path):
    golden.compute(*_inputs(), softmax_scale=0.4, options=golden.GoldenOptions(method="mpmath", cache_dir=tmp_path))
    options = golden.GoldenOptions(method="mpmath", precision_bits=128, cache_dir=tmp_path)
    golden.compute(*_inputs(), softmax_scale=0.4, options=options)
    golden.compute(*_inputs(), softmax_scale=0.4, options=golden.GoldenOptions(method="fast", cache_dir=tmp_path))
    golden.compute(
        *_inputs(), softmax_scale=0.4, options=golden.GoldenOptions(method="fast", certify_rows=2, cache_dir=tmp_path)
    )
    assert len(_entries(tmp_path)) == 4


def _damage(path, how):
    blob = path.read_bytes()
    if how == "flipped-byte":
        position = len(blob) - 100
        path.write_bytes(blob[:position] + bytes([blob[position] ^ 0xFF]) + blob[position + 1 :])
    elif how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "garbage":
        path.write_bytes(b"not a golden cache entry\n")
    elif how == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["flipped-byte", "truncated", "garbage", "empty"])
def test_corrupt_entry_is_detected_recomputed_and_replaced(tmp_path, how):
    first = _compute(tmp_path)
    (entry,) = tmp_path.iterdir()
    _damage(entry, how)
    with pytest.warns(GoldenCacheWarning, match="corrupt"):
        second = _compute(tmp_path)
    _assert_same(first, second)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _assert_same(first, _compute(tmp_path))


def test_entry_under_another_key_is_not_trusted(tmp_path):
    """A valid file renamed to another key's name (e.g. a botched copy) is corrupt there."""
    _compute(tmp_path)
    (entry,) = tmp_path.iterdir()
    other = _compute(tmp_path / "other", softmax_scale=0.5)
    (other_entry,) = (tmp_path / "other").iterdir()
    os.replace(entry, tmp_path / other_entry.name)
    with pytest.warns(GoldenCacheWarning, match="holds key"):
        recomputed = _compute(tmp_path, softmax_scale=0.5)
    _assert_same(other, recomputed)


def test_entry_with_wrong_shapes_is_not_trusted(tmp_path):
    key = "0" * 64
    cache.store(tmp_path, key, {"out": np.zeros((1, 2, 3, 4))}, {"method": "mpmath", "certified_bound": {}})
    with pytest.warns(GoldenCacheWarning, match="expected float64"):
        assert cache.load(tmp_path, key, {"out": (1, 2, 3, 5)}) is None
    assert cache.load(tmp_path, key, {"out": (1, 2, 3, 4)}) is not None


WRITER = """
import pathlib, sys, time
import numpy as np
from fa2_verify.golden import cache
directory, key, seed, go = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), pathlib.Path(sys.argv[4])
arrays = {"out": np.random.default_rng(seed % 2).standard_normal((64, 64))}
while not go.exists():
    time.sleep(0.001)
for _ in range(40):
    cache.store(directory, key, arrays, {"method": "fast", "certified_bound": {"out": 0.0}})
"""


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path):
    """Four processes rewrite one entry while this one reads it: every read is a valid entry or a miss."""
    key, go = "ab" * 32, tmp_path / "go"
    directory = tmp_path / "cache"
    root = pathlib.Path(__file__).resolve().parents[1]
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(directory), key, str(seed), str(go)], cwd=root)
        for seed in range(4)
    ]
    expected = [np.random.default_rng(seed).standard_normal((64, 64)) for seed in (0, 1)]
    go.touch()
    reads = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        while any(process.poll() is None for process in writers) or reads == 0:
            loaded = cache.load(directory, key, {"out": (64, 64)})
            if loaded is not None:
                reads += 1
                assert any(np.array_equal(loaded[0]["out"], value) for value in expected)
    assert [process.wait() for process in writers] == [0, 0, 0, 0]
    assert reads > 0
    assert _entries(directory) == [f"{key}.golden"]


def test_unwritable_cache_dir_is_a_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    with pytest.raises(UsageError, match="cache_dir=") as info:
        _compute(blocker)
    assert "point --golden-cache or $FA2_VERIFY_GOLDEN_CACHE at a writable directory" in str(info.value)


# The header is checked as much as the payload: an entry whose header was edited, does not parse, or claims a
# golden no computation would give is recomputed, never trusted.


def _header_and_payload(entry: pathlib.Path) -> tuple[bytes, bytes]:
    blob = entry.read_bytes()
    header_end = blob.index(b"\n", len(cache.MAGIC))
    return blob[len(cache.MAGIC) : header_end], blob[header_end + 1 :]


def _edit_header(entry: pathlib.Path, edit) -> None:
    """Replace the entry's header line by ``edit(header)``, leaving its recorded sha256 as it was."""
    header, payload = _header_and_payload(entry)
    edited = edit(header)
    assert edited != header, "the edit changed nothing"
    entry.write_bytes(cache.MAGIC + edited + b"\n" + payload)


def _forge(entry: pathlib.Path, meta) -> None:
    """What one who can write the cache does: put ``meta`` in the header and recompute the digest."""
    _, payload = _header_and_payload(entry)
    with np.load(io.BytesIO(payload)) as archive:
        arrays = {name: archive[name] for name in archive.files}
    cache.store(entry.parent, entry.name.removesuffix(".golden"), arrays, meta)


def _assert_recomputed_then_served(tmp_path, monkeypatch, tamper) -> None:
    """After ``tamper(entry)`` the golden is recomputed, with a warning, equal to the first, and its entry
    rewritten: the next call reads it without computing."""
    first = _compute(tmp_path)
    (entry,) = tmp_path.iterdir()
    tamper(entry)
    with pytest.warns(GoldenCacheWarning, match="corrupt"):
        _assert_same(first, _compute(tmp_path))
    _forbid_computing(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _assert_same(first, _compute(tmp_path))


def _check_with_cache(kernel, case, cache_dir, method):
    return check_case(kernel, case, golden_options=golden.GoldenOptions(method=method, cache_dir=cache_dir))


@pytest.mark.parametrize(
    "method, factor, edit",
    [
        ("fast", 3.0, lambda header: re.sub(rb"e-(\d+)", rb"e+\1", header)),
        ("mpmath", 50.0, lambda header: re.sub(rb'("out": ?)0\.0', rb"\g<1>9.0", header)),
    ],
    ids=["certified-bound-exponent", "certified-bound-value"],
)
def test_edited_header_is_recomputed_and_the_erroneous_kernel_still_fails(tmp_path, monkeypatch, method, factor, edit):
    """The reported attack: the certified bound widens every bound (docs/error-model.md, (11)), so an entry
    whose header says ``e+17`` for ``e-17`` (fast) or ``9.0`` for ``0.0`` (mpmath) passed a kernel with 3 or 50
    times the error of ``out``.  The digest covers the header: the entry is recomputed and the kernel fails."""
    spec = CaseSpec(1, 16, 16, 2, 1, 16, "float16", backward=False)
    case = make_case(spec, "cpu")
    erroneous = ScaledOutError("reference", factor)
    erroneous.degrade = True
    kernel = LoadedKernel("erroneous", erroneous)
    fresh = _check_with_cache(kernel, case, tmp_path, method)
    assert fresh.status == "failed" and not fresh.comparisons["out"].passed
    (entry,) = tmp_path.iterdir()
    _edit_header(entry, edit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tampered = _check_with_cache(kernel, case, tmp_path, method)
    assert tampered.status == "failed" and tampered.golden == fresh.golden
    (warning,) = caught
    assert warning.category is GoldenCacheWarning and "sha256 of header and payload mismatch" in str(warning.message)
    _forbid_computing(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _check_with_cache(kernel, case, tmp_path, method).golden == fresh.golden


def _deep(header: bytes) -> bytes:
    return b"[" * 20_000 + b"]" * 20_000


@pytest.mark.parametrize(
    "edit",
    [
        lambda header: header[:-1],
        _deep,
        lambda header: header.replace(b'"size":', b'"size":' + b"9" * 5_000 + b",\"was\":"),
        lambda header: header.replace(b'"key":"', b'"key":"\xff\xfe'),
        lambda header: header.replace(b"0.0", b"NaN", 1),
        lambda header: header.replace(b"0.0", b"Infinity", 1),
        lambda header: b"[]",
    ],
    ids=["invalid-json", "nested-20000-deep", "5000-digit-integer", "not-utf-8", "nan", "infinity", "not-an-object"],
)
def test_header_that_does_not_parse_is_recomputed_never_a_traceback(tmp_path, monkeypatch, edit):
    _assert_recomputed_then_served(tmp_path, monkeypatch, lambda entry: _edit_header(entry, edit))


BOUNDS = {name: 0.0 for name in ("out", "lse", "dq", "dk", "dv")}


@pytest.mark.parametrize(
    "meta",
    [
        {"method": "mpmath", "certified_bound": {**BOUNDS, "out": 9.0}},
        {"method": "fast", "certified_bound": {**BOUNDS, "out": 1e17}},
        {"method": "fast", "certified_bound": {**BOUNDS, "out": 2 * LIMIT}},
        {"method": "mpmath", "certified_bound": {**BOUNDS, "out": LIMIT}},
        {"method": "fast", "certified_bound": {**BOUNDS, "out": "1e-17"}},
        {"method": "fast", "certified_bound": {**BOUNDS, "out": -1e-17}},
        {"method": "fast", "certified_bound": {**BOUNDS, "out": True}},
        {"method": "fast", "certified_bound": {**BOUNDS, "out": None}},
        {"certified_bound": BOUNDS},
        {"method": "exact", "certified_bound": BOUNDS},
        {"method": ["fast"], "certified_bound": BOUNDS},
        {"method": "mpmath", "certified_bound": {name: 0.0 for name in ("out", "lse")}},
        {"method": "mpmath", "certified_bound": {**BOUNDS, "delta": 0.0}},
        {"method": "mpmath", "certified_bound": [0.0] * 5},
        {"method": "mpmath", "certified_bound": BOUNDS, "trusted": True},
        ["mpmath", BOUNDS],
    ],
    ids=[
        "mpmath-claims-9", "fast-claims-1e17", "fast-claims-twice-the-limit", "mpmath-claims-the-fast-limit",
        "string", "negative", "bool", "null", "missing-method", "unknown-method", "method-not-a-string",
        "missing-outputs", "extra-output", "bounds-not-an-object", "extra-meta-key", "meta-not-an-object",
    ],
)
def test_meta_a_computation_could_not_give_is_refused_even_with_a_valid_digest(tmp_path, monkeypatch, meta):
    """One who can write the cache recomputes the digest: the meta itself must be what ``compute`` writes, each
    bound at most what the method certifies (``MAX_CERTIFIED_BOUND``), or the entry is recomputed."""
    _assert_recomputed_then_served(tmp_path, monkeypatch, lambda entry: _forge(entry, meta))


def test_a_forged_entry_within_the_limits_is_served_without_computing(tmp_path, monkeypatch):
    """The positive control of the test above: a meta ``compute`` could have written, the fast path's limit
    included, is served from the cache."""
    first = _compute(tmp_path)
    (entry,) = tmp_path.iterdir()
    _forge(entry, {"method": "fast", "certified_bound": {**BOUNDS, "out": LIMIT}})
    _forbid_computing(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        served = _compute(tmp_path)
    assert served.method == "fast" and served.certified_bound == {**BOUNDS, "out": LIMIT}
    assert torch.equal(served.out, first.out)


def test_fresh_golden_claiming_more_than_the_limit_is_an_error_and_is_not_cached(tmp_path, monkeypatch):
    """The cap holds the computation too: a certification that returned a bound above 2**-40 fails the golden's
    guarantee (one line, ``GoldenError``) instead of widening every bound, and nothing is cached."""
    monkeypatch.setattr(certify, "certify", lambda *args, **kwargs: {**BOUNDS, "out": 2 * LIMIT})
    with pytest.raises(GoldenError, match=r"certified_bound\['out'\]=1.8\d*e-12 is not a number from 0 to 9.09e-13"):
        _compute(tmp_path, method="fast")
    assert _entries(tmp_path) == []


def test_an_entry_over_the_limit_of_its_device_is_recomputed_and_not_stored(tmp_path, monkeypatch):
    """``fits``: up to MAX_ENTRY_BYTES of float64 outputs on the CPU, MAX_DEVICE_ENTRY_BYTES for a golden
    computed on a GPU; ``compute`` stores nothing larger."""
    elements = cache.MAX_DEVICE_ENTRY_BYTES // 8
    assert cache.fits({"out": (elements,)}, "cuda") and not cache.fits({"out": (elements + 1,)}, "cuda")
    assert cache.fits({"out": (elements + 1,)}, "cpu") and not cache.fits({"out": (cache.MAX_ENTRY_BYTES // 8 + 1,)}, "cpu")
    outputs_bytes = 8 * sum(getattr(_compute(None), name).numel() for name in OUTPUTS)
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", outputs_bytes - 8)
    _compute(tmp_path)
    assert _entries(tmp_path) == []
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", outputs_bytes)
    _compute(tmp_path)
    assert len(_entries(tmp_path)) == 1
