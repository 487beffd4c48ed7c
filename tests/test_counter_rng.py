"""The counter-based generator: Random123's known answers, its distributions, and the same bits on every device."""

import math

import pytest
import torch

from fa2_verify.core import values
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.counter_rng import CounterRNG, _cos_sin, _log, philox
from fa2_verify.core.digest import digest

#: Random123's kat_vectors for philox4x32 with 10 rounds: counter, key, expected words.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, expected):
    assert philox(torch.tensor([counter], dtype=torch.int64), key)[0].tolist() == list(expected)


def test_log_and_circle_functions_are_accurate():
    x = torch.rand(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 2.0**-60
    assert float(((_log(x) - torch.log(x)).abs() / torch.log(x).abs()).max()) < 4 * 2.0**-52
    cosine, sine = _cos_sin(x.clamp(max=1 - 2.0**-53))
    assert float((cosine - torch.cos(2 * math.pi * x.clamp(max=1 - 2.0**-53))).abs().max()) < 2.0**-48
    assert float((sine - torch.sin(2 * math.pi * x.clamp(max=1 - 2.0**-53))).abs().max()) < 2.0**-48


def test_draws_have_their_distributions():
    rng = CounterRNG(2024)
    normal = rng.normal((1_000_000,))
    assert abs(float(normal.mean())) < 0.005 and abs(float(normal.std()) - 1) < 0.005
    assert abs(float((normal.abs() > 3).double().mean()) - 0.0027) < 0.0005
    uniform = rng.uniform((1_000_000,), -1.0, 3.0)
    assert float(uniform.min()) >= -1.0 and float(uniform.max()) < 3.0 and abs(float(uniform.mean()) - 1) < 0.01
    counts = torch.bincount(rng.integers(7, (700_000,)), minlength=7)
    assert len(counts) == 7 and int((counts - 100_000).abs().max()) < 2_000
    assert sorted(rng.permutation(1000).tolist()) == list(range(1000))


def test_draws_do_not_depend_on_the_chunk_or_the_threads(monkeypatch):
    """A value is a function of its counter: chunks of 7 counters per thread, on one thread or three, give the
    draws of the default chunks."""
    from fa2_verify.core import counter_rng

    default = CounterRNG(4)
    expected = [default.normal((2001,)), default.integers(13, (999,))]
    monkeypatch.setattr(counter_rng, "_CPU_THREAD_COUNTERS", 7)
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            rng = CounterRNG(4)
            assert torch.equal(rng.normal((2001,)), expected[0]) and torch.equal(rng.integers(13, (999,)), expected[1])
    finally:
        torch.set_num_threads(threads)


def test_draws_are_numbered_in_order_and_keyed_by_the_seed():
    first, again, other = CounterRNG(5), CounterRNG(5), CounterRNG(6)
    a, b = first.normal((33,)), first.normal((33,))
    assert torch.equal(a, again.normal((33,))) and not torch.equal(a, b)
    assert not torch.equal(a, other.normal((33,)))
    # a draw's values do not depend on how it is chunked or shaped
    assert torch.equal(CounterRNG(9).uniform((4, 1001)).reshape(-1)[:3001], CounterRNG(9).uniform((3001,)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inputs_are_the_same_bits_on_every_device():
    for generator in sorted(values.GENERATORS):
        for dtype in ("float16", "bfloat16", "float32", "float64"):
            spec = CaseSpec(batch=2, seqlen_q=300, seqlen_k=1100, heads_q=6, heads_kv=2, head_dim=72, dtype=dtype,
                            generator=generator, seed=11, causal=True)
            host, device = make_case(spec, "cpu"), make_case(spec, "cuda")
            for name in ("q", "k", "v", "dout"):
                assert torch.equal(digest(getattr(host, name)).cuda(), digest(getattr(device, name))), (generator, dtype, name)


def test_a_case_too_large_to_draw_on_the_gpu_is_drawn_on_the_host():
    """Drawing holds the inputs in float64 with temporaries: past DEVICE_DRAW_BYTES (a q of 2^31 elements) the
    draws go to the host, with the same values, so the device holds only the rounded inputs."""
    large = CaseSpec(batch=2, seqlen_q=65536, seqlen_k=65536, heads_q=64, heads_kv=8, head_dim=256, dtype="float16")
    small = CaseSpec(batch=1, seqlen_q=131072, seqlen_k=131072, heads_q=1, heads_kv=1, head_dim=128, dtype="bfloat16")
    assert values.draw_bytes(large) > values.DEVICE_DRAW_BYTES and values.draw_device(large, "cuda").type == "cpu"
    assert values.draw_device(small, "cuda").type == "cuda" and values.draw_device(large, "cpu").type == "cpu"
