"""The benchmark's ``sweep`` section: candidate tile configurations of one pass, timed.

Candidate tiles (:data:`SWEEP_TILES`) of a pass at 16k tokens, causal and
full; the best by geometric mean per (pass, head_dim, seqlen bucket)
(:func:`best_tiles`), which ``--use-sweep`` benches with.  A backward point
times the whole backward call: ``backward_kv`` tiles in the default call and
in the deterministic one, ``backward_dq`` tiles in the deterministic call, so
the two modes' totals compare directly.  The default call adds dQ by atomics
except where the table runs the dQ pass by default
(:data:`.configs.SEPARATE_DQ`, head_dim 64 on Hopper since the sweep that
chose it): there both modes time the same launches, and timing the atomics
again means taking the entry out of that table first.
"""

from __future__ import annotations

import dataclasses
import math

from fa2_verify.bench.timing import HIDDEN, TOKENS, median_ms, timing_inputs
from fa2_verify.kernels.triton_fa2.configs import TileConfig, bucket


#: (pass, head_dim) -> candidate tiles.  Earlier sweeps (docs/triton-kernel.md) settled the
#: long-sequence rows and TMA; these look for the best forward tiles of short sequences and
#: the head_dim 64 backward, whose ratio to PyTorch's FA2 trails head_dim 128's.
SWEEP_TILES: dict[tuple[str, int], tuple[TileConfig, ...]] = {
    ("forward", 64): tuple(TileConfig(*t) for t in (
        (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (128, 32, 4, 3), (64, 128, 4, 3),
        (128, 64, 8, 2))),
    ("forward", 128): tuple(TileConfig(*t) for t in (
        (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2),
        (128, 32, 8, 3), (64, 32, 4, 3))),
    ("backward_kv", 64): tuple(TileConfig(*t) for t in (
        (32, 128, 4, 3, True), (32, 128, 4, 3), (32, 128, 4, 4, True), (32, 128, 8, 3, True),
        (64, 128, 8, 3, True), (64, 128, 8, 3), (64, 128, 4, 3, True), (64, 64, 4, 3, True),
        (32, 64, 4, 3, True), (16, 128, 4, 3, True), (64, 128, 8, 2, True))),
    ("backward_dq", 64): tuple(TileConfig(*t) for t in (
        (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 8, 3), (64, 128, 8, 3), (128, 128, 8, 3),
        (128, 64, 8, 2))),
}

#: Sequence lengths each pass is swept at (16k tokens per batch).
SWEEP_SEQLENS: dict[str, tuple[int, ...]] = {
    "forward": (1024, 2048),
    "backward_kv": (1024, 4096, 16384),
    "backward_dq": (1024, 4096, 16384),
}

#: The backward modes each pass is swept in (``deterministic``): the dq pass exists only in one.
SWEEP_MODES: dict[str, tuple[bool, ...]] = {"forward": (False,), "backward_kv": (False, True), "backward_dq": (True,)}


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    pass_name: str
    head_dim: int
    causal: bool
    tile: TileConfig
    seqlen: int = 4096
    dtype: str = "float16"
    deterministic: bool = False


SWEEP_POINTS: tuple[SweepPoint, ...] = tuple(
    SweepPoint(pass_name, head_dim, causal, tile, seqlen, deterministic=deterministic)
    for (pass_name, head_dim), tiles in SWEEP_TILES.items()
    for seqlen in SWEEP_SEQLENS[pass_name]
    for deterministic in SWEEP_MODES[pass_name]
    for causal in (False, True)
    for tile in tiles
)


def sweep_point(point: SweepPoint, *, warm_only: bool = False) -> dict:
    """Time one pass with one tile config; a backward point times the backward call alone (forward done once)."""
    from fa2_verify.kernels.triton_fa2 import launch

    q, k, v, dout = timing_inputs(TOKENS // point.seqlen, point.seqlen, HIDDEN // point.head_dim, point.head_dim,
                                  point.dtype, seed=7)
    scale = 1.0 / math.sqrt(point.head_dim)
    mask = {"softmax_scale": scale, "causal": point.causal}
    if point.pass_name == "forward":
        fn = lambda: launch.forward(q, k, v, tiles={"forward": point.tile}, **mask)  # noqa: E731
    else:
        out, lse = launch.forward(q, k, v, **mask)
        fn = lambda: launch.backward(dout, q, k, v, out, lse, deterministic=point.deterministic,  # noqa: E731
                                     tiles={point.pass_name: point.tile}, **mask)
    try:
        fn()
        if warm_only:
            return {}
        ms = median_ms(fn)
    except Exception as exc:  # a tile that does not compile or fit is a sweep result, not a crash
        return {"point": _point_dict(point), "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"point": _point_dict(point), "ms": ms}


def _point_dict(point: SweepPoint) -> dict:
    record = dataclasses.asdict(point)
    record["tile"] = point.tile.as_dict()
    return record


def best_tiles(results: list[dict]) -> dict[tuple[str, int, str], TileConfig]:
    """Per (pass, head_dim, seqlen bucket): the tile with the smallest geometric-mean time over
    causal/full and the bucket's seqlens (only tiles measured at all of them), each pass in the
    mode that runs it by default (``backward_kv`` with atomic dq, ``backward_dq`` deterministic)."""
    times: dict[tuple[str, int, str, tuple], list[float]] = {}
    for result in results:
        if "ms" not in result:
            continue
        point = result["point"]
        if point.get("deterministic", False) != SWEEP_MODES[point["pass_name"]][0]:
            continue
        key = (point["pass_name"], point["head_dim"], bucket(point["seqlen"]), tuple(point["tile"].values()))
        times.setdefault(key, []).append(result["ms"])
    best: dict[tuple[str, int, str], tuple[float, TileConfig]] = {}
    for (pass_name, head_dim, size, tile), values in times.items():
        needed = 2 * sum(1 for seqlen in SWEEP_SEQLENS[pass_name] if bucket(seqlen) == size)
        if len(values) < needed:
            continue
        score = math.exp(sum(map(math.log, values)) / len(values))
        if (pass_name, head_dim, size) not in best or score < best[(pass_name, head_dim, size)][0]:
            best[(pass_name, head_dim, size)] = (score, TileConfig(*tile))
    return {key: tile for key, (_score, tile) in best.items()}
