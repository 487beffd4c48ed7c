"""core.digest: equal bits give equal digests, any changed element changes it, views hash their elements."""

import torch

from fa2_verify.core.digest import WIDTH, digest


def test_digest_tells_changed_bits_and_only_them():
    x = torch.randn(3, 70, 4, 40, generator=torch.Generator().manual_seed(0)).half()
    reference = digest(x)
    assert torch.equal(reference, digest(x.clone()))
    for index in [(0, 0, 0, 0), (2, 69, 3, 39), (1, 33, 2, 7)]:
        changed = x.clone()
        changed[index] = -changed[index]
        assert not torch.equal(reference, digest(changed)), index
    signed_zero = torch.zeros(5)
    assert not torch.equal(digest(signed_zero), digest(-signed_zero))
    nan = torch.full((5,), float("nan"))
    assert torch.equal(digest(nan), digest(nan.clone()))


def test_a_view_hashes_its_elements_not_the_memory_around_them():
    x = torch.randn(2, 50, 3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    padded = torch.full((2, 50, 5, 16), float("nan"), dtype=torch.float64)
    view = padded[:, :, 1:4]
    view.copy_(x)
    assert not view.is_contiguous()
    assert torch.equal(digest(view), digest(x))
    assert digest(x).shape == (-(-x.numel() * 4 // WIDTH), 2)
