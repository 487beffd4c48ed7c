"""properties.gpu_shares and verify.memory's shares: workers sharing a GPU under a per-example memory budget.

No GPU here: the CUDA calls the modules make are replaced by a stand-in device of 80 GB (an H100's
79.2 GiB) that records the allocator cap a process sets."""

from __future__ import annotations

import pytest
import torch

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import CaseTooLarge, UsageError
from fa2_verify.properties import gpu_shares, profiles
from fa2_verify.verify import memory

H100 = 85_051_572_224
H200 = 150_754_820_096
GiB = 2**30


@pytest.fixture
def gpu(monkeypatch):
    """One stand-in CUDA device: 60 GiB free, 4 GiB reserved by this process of which 1 GiB allocated."""
    caps: dict[int, float] = {}
    monkeypatch.setattr(memory, "_shares", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("P", (), {"total_memory": H100}))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, index: caps.update({index: fraction}))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (60 * GiB, H100))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 4 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: 1 * GiB)
    monkeypatch.setattr(gpu_shares, "_host_gpus", lambda: (1, H100))
    return caps


def test_a_share_is_an_equal_part_of_what_the_contexts_leave():
    assert memory.process_share(100 * GiB, 1) == 100 * GiB - memory.CONTEXT_BYTES
    assert memory.process_share(100 * GiB, 4) == (100 * GiB - 4 * memory.CONTEXT_BYTES) // 4
    assert memory.process_share(memory.CONTEXT_BYTES, 2) == 0


def test_workers_on_a_gpu_follow_the_workers_placement():
    assert [gpu_shares.workers_on_device(index, 5, "cuda", 2) for index in range(5)] == [3, 2, 3, 2, 3]
    assert gpu_shares.workers_on_device(1, 5, "cuda:1", 2) == 5
    assert gpu_shares.workers_on_device(3, 4, "cuda", 1) == 4


def test_the_budget_bounds_the_workers_per_gpu():
    """`scale` budgets 20 GB an example: 3 share an 80 GB GPU, 6 a 141 GB one; never more than the cores."""
    assert profiles.get("scale").limits("cuda").max_bytes == 20 * 10**9
    assert gpu_shares.workers_per_gpu("scale", 16, 1, H100) == 3
    assert gpu_shares.workers_per_gpu("scale", 16, 1, H200) == 6
    assert gpu_shares.workers_per_gpu("scale", 128, 8, H200) == 6
    assert gpu_shares.workers_per_gpu("scale", 2, 1, H200) == 2
    assert gpu_shares.workers_per_gpu("scale", 16, 1, 16 * GiB) == 1
    assert gpu_shares.workers_per_gpu("ci", 16, 1, H100) == 16
    assert gpu_shares.workers_per_gpu("ci", 16, 2, H100) == 8


def test_a_worker_keeps_to_its_share_and_counts_only_it_as_free(gpu):
    gpu_shares.share_memory("scale", "cuda", 3, 2, "cuda")
    share = memory.process_share(H100, 3)
    assert gpu[0] == pytest.approx(share / H100)
    # 60 GiB free on the device and 3 GiB cached, but the share leaves its size less the 1 GiB allocated
    assert memory.free_memory("cuda") == share - GiB


def test_a_case_over_the_share_is_declined_naming_it(gpu):
    memory.keep_to_share("cuda", 3)
    spec = CaseSpec(batch=16, seqlen_q=8192, seqlen_k=8192, heads_q=16, heads_kv=16, head_dim=128, dtype="float16")
    needed = memory.estimate(spec, "cuda").device
    assert memory.process_share(H100, 3) - GiB < needed < 60 * GiB
    with pytest.raises(CaseTooLarge, match=r"needs about 49\.\d+ GiB on cuda, of which this process may use "
                                           r"24\.4 GiB \(fewer processes per GPU get more\) \(at its error model "
                                           r"stage\), 23\.4 GiB is free"):
        memory.require_fits(spec, "cuda")


def test_without_a_share_the_free_memory_is_the_devices(gpu):
    assert memory.free_memory("cuda") == 60 * GiB + 3 * GiB


@pytest.mark.parametrize("profile_name, workers", [("ci", 16), ("scale", 1)])
def test_no_share_without_a_budget_or_a_second_worker(gpu, profile_name, workers):
    gpu_shares.share_memory(profile_name, "cuda", workers, 0, "cuda")
    assert gpu == {} and memory._shares == {}


def test_more_workers_than_the_budget_lets_share_a_gpu_are_refused(gpu):
    gpu_shares.share_memory("scale", "cuda", 3, None, "cuda")
    with pytest.raises(UsageError, match=r"^-n 4: 4 workers share a GPU of 79\.2 GiB, each 17\.8 GiB, below the "
                                         r"scale profile's 18\.6 GiB per example: run at most 3 per GPU"):
        gpu_shares.share_memory("scale", "cuda", 4, None, "cuda")
    assert gpu == {}, "the controller sets no cap"


class _Config:
    def __init__(self, **options):
        self.options = options

    def getoption(self, name, default=None):
        return self.options.get(name, default)


def test_n_auto_gives_every_gpu_its_workers(gpu, monkeypatch):
    monkeypatch.setattr(gpu_shares, "_host_gpus", lambda: (2, H100))
    monkeypatch.setattr(gpu_shares.os, "sched_getaffinity", lambda pid: set(range(32)))
    assert gpu_shares.auto_workers(_Config(fa2_kernel="triton", fa2_device="cuda", fa2_profile="scale")) == 6
    assert gpu_shares.auto_workers(_Config(fa2_kernel="triton", fa2_device="cuda", fa2_profile="ci")) == 32
    assert gpu_shares.auto_workers(_Config(fa2_kernel="triton", fa2_device="cpu", fa2_profile="scale")) is None
    assert gpu_shares.auto_workers(_Config(fa2_device="cuda", fa2_profile="scale")) is None


def test_the_command_prints_the_workers_per_gpu(gpu, monkeypatch, capsys):
    monkeypatch.setattr(gpu_shares.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert gpu_shares.main(["scale"]) == 0 and capsys.readouterr().out == "3\n"
    assert gpu_shares.main(["huge"]) == 2
    assert "usage: python -m fa2_verify.properties.gpu_shares" in capsys.readouterr().err
    monkeypatch.setattr(gpu_shares, "_host_gpus", lambda: (0, 0))
    assert gpu_shares.main(["scale"]) == 2 and "no CUDA GPU is visible" in capsys.readouterr().err


def test_the_controller_describes_the_shares_it_allowed(gpu):
    line = gpu_shares.share_memory("scale", "cuda", 3, None, "cuda")
    assert line == ("gpu memory: 3 workers share each GPU of 79.2 GiB, each keeping to 24.4 GiB "
                    "(scale profile: 18.6 GiB per example)")
    assert gpu_shares.share_memory("ci", "cuda", 3, None, "cuda") is None
    assert gpu_shares.share_memory("scale", "cuda", 3, 0, "cuda") is None, "a worker reports nothing"
