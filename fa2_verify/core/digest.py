"""A digest of a tensor's bits, computed on its device with one read of the tensor and no full copy.

The bits are read as 16-bit words ``x_t``, ``WIDTH`` words a row, and each row
is hashed twice as ``sum_t w_t x_t mod p`` (``p = 2^31 - 1``) with two fixed
vectors of weights drawn uniformly from ``[1, p)``: a linear hash from a
universal family (Carter and Wegman 1979), so two rows that differ collide
with probability at most ``1/p`` per weight vector, ``2^-62`` for both, for
any difference not chosen with knowledge of the weights.  Every product is
below 2^47 and every row sum below 2^62, exact in int64.  Rows shorter than
``WIDTH`` are padded with zeros; the digest holds no shape, so a caller
comparing tensors of different shapes says so itself.
"""

from __future__ import annotations

import functools

import torch

from fa2_verify.core.counter_rng import CounterRNG

#: 16-bit words per hashed row.
WIDTH = 1 << 15
_PRIME = 2**31 - 1
#: Elements of a tensor read (and copied, when it is not contiguous) at a time.
_PIECE_ELEMENTS = 1 << 24
#: Seed of the weights: any fixed seed; fixed, so a digest is comparable across processes.
_WEIGHT_SEED = 0x5EED_D16E57


@functools.cache
def _weights(device: torch.device) -> torch.Tensor:
    return CounterRNG(_WEIGHT_SEED, device).integers(_PRIME - 1, (WIDTH, 2)) + 1


def digest(tensor: torch.Tensor) -> torch.Tensor:
    """``(rows, 2)`` int64 on ``tensor``'s device: both hashes of each row of its 16-bit words, in row-major order
    of its elements (a view is hashed as its elements, not the memory around them)."""
    weights = _weights(tensor.device)
    flat = tensor.detach().reshape(-1) if tensor.is_contiguous() else None
    pieces = []
    for start in range(0, tensor.numel(), _PIECE_ELEMENTS):
        stop = min(tensor.numel(), start + _PIECE_ELEMENTS)
        piece = flat[start:stop] if flat is not None else _elements(tensor, start, stop)
        words = piece.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
        words = torch.nn.functional.pad(words, (0, -words.numel() % WIDTH)).reshape(-1, WIDTH)
        pieces.append(torch.stack([(words * weights[:, column]).sum(dim=1) % _PRIME for column in range(2)], dim=1))
    return torch.cat(pieces) if pieces else torch.zeros((0, 2), dtype=torch.int64, device=tensor.device)


def _elements(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Elements ``start:stop`` of a non-contiguous ``tensor`` in row-major order, copying only those."""
    index = torch.arange(start, stop, device=tensor.device)
    return tensor.detach()[torch.unravel_index(index, tensor.shape)]
