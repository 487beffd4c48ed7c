"""One side of ``benchmarks/bench_before_after.py``: benchmark rows served over stdin, one JSON line each way.

Run as a script with ``PYTHONPATH`` naming the package root of its side
first, so that ``fa2_verify`` (and so the triton kernel) is that side's copy.
It first prints ``{"package": ..., "device": ..., "torch": ..., "triton": ...}``;
then for each line ``{"mode", "causal", "head_dim", "seqlen", "dtype"}`` it
reads, it times that row with that copy's own :func:`bench.timing.bench_row`
(triton and PyTorch's FA2 in this process, on the same inputs, without the
correctness check) and prints the result, or ``{"error": ...}``.  Keeping the
process alive between rows lets the controller interleave the two sides row
by row with each kernel compiled once.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    import torch
    import triton

    import fa2_verify
    from fa2_verify.bench.timing import BenchRow, bench_row

    hello = {"package": os.path.dirname(fa2_verify.__file__), "device": torch.cuda.get_device_name(),
             "torch": torch.__version__, "triton": triton.__version__}  # fmt: skip
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        row = BenchRow(**json.loads(line))
        try:
            result = bench_row(row, with_check=False)
            reply = {key: result[key] for key in ("ms_triton", "ms_sdpa", "ratio")}
        except Exception as exc:  # a row that fails on one side is reported in its table, the run goes on
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
