"""How many compiles, and how many seconds, the flex-attention target spends on a run of varied shapes.

``python3 lab/probes/probe_flex_compile.py [--cases 24] [--out DIR]`` calls the
``flex-attention`` target's forward and backward (as the property suite does)
on the same list of varied cases (lengths 1 to 300, unmasked, causal and window
masks, float16, bfloat16 and float32, head dims 16 to 128, MHA and GQA) in one
process per compile mode, the modes side by side, each with its own empty
Inductor and Triton caches:

* ``target``: the target as it is, ``torch.compile(flex_attention,
  dynamic=False)`` with the mask's offsets captured as ints;
* ``auto``: PyTorch's default shape handling (automatic dynamic shapes), the
  offsets still ints;
* ``auto-tensor``: the default shape handling with the offsets captured as 0-d
  tensors (which Dynamo lifts into graph inputs instead of baking them in);
* ``target-reset``: the target, with Dynamo's compiled code dropped
  (``torch._dynamo.reset()``) and PyTorch's cached blocks freed after every case.

``--modes`` picks some of them (default: the first three).  It prints one
Markdown row per mode: cases run, cases that raised, Dynamo's graph count,
the seconds of the whole list and of its slowest case, the GPU memory the
process held (``nvidia-smi``) after the first and the last case and what
PyTorch's allocator had reserved at the end, and the largest difference of
``out`` from the ``reference`` kernel run in float64, which tells a compiled
kernel that computes attention from one that does not (the property suite
judges the numbers).  Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

MODES = ("target", "auto", "auto-tensor", "target-reset")


def cases(count: int) -> list[dict]:
    """A fixed list of varied cases (seeded)."""
    rng = random.Random(0)
    drawn = []
    for _ in range(count):
        heads_q, heads_kv = rng.choice([(2, 2), (4, 1), (4, 2)])
        seqlen_q = rng.randint(128, 300) if heads_q != heads_kv else rng.randint(1, 300)
        drawn.append(
            {
                "seqlen_q": seqlen_q,
                "seqlen_k": rng.randint(1, 300),
                "heads_q": heads_q,
                "heads_kv": heads_kv,
                "head_dim": rng.choice([16, 32, 64, 128]),
                "dtype": rng.choice(["float16", "bfloat16", "float32"]),
                "window": rng.choice([(-1, -1), (-1, 0), (rng.randint(0, 40), rng.randint(0, 40))]),
            }
        )
    return drawn


def _tensor_mask_mod(seqlen_q, seqlen_k, window, device):
    """The target's mask with its offsets captured as 0-d tensors."""
    import torch

    shift = torch.tensor(seqlen_k - seqlen_q, device=device)
    left, right = (None if side == -1 else torch.tensor(side, device=device) for side in window)

    def mask_mod(batch, head, q_idx, kv_idx):
        visible = kv_idx >= 0
        if left is not None:
            visible = visible & (kv_idx >= q_idx + shift - left)
        if right is not None:
            visible = visible & (kv_idx <= q_idx + shift + right)
        return visible

    return mask_mod


def run_mode(mode: str, count: int) -> dict:
    import torch
    from torch.nn.attention.flex_attention import flex_attention as eager

    from fa2_verify.kernels import flex_attention as target

    if mode == "auto-tensor":
        target.window_mask_mod = lambda *args: _tensor_mask_mod(*args, torch.device("cuda"))
    if mode != "target":
        compiled = torch.compile(eager, fullgraph=True)
        target._compiled = lambda: compiled
    kernel = target.KERNEL
    errors, slowest, worst, held = [], 0.0, 0.0, []
    start = time.perf_counter()
    for index, case in enumerate(cases(count)):
        gen = torch.Generator(device="cuda").manual_seed(index)
        dtype = getattr(torch, case["dtype"])
        shape_q = (1, case["seqlen_q"], case["heads_q"], case["head_dim"])
        shape_k = (1, case["seqlen_k"], case["heads_kv"], case["head_dim"])
        q = torch.randn(shape_q, device="cuda", generator=gen).to(dtype)
        k, v = (torch.randn(shape_k, device="cuda", generator=gen).to(dtype) for _ in range(2))
        masking = {"softmax_scale": case["head_dim"] ** -0.5, "window_size": tuple(case["window"])}
        began = time.perf_counter()
        try:
            out, lse = kernel.forward(q, k, v, **masking)
            kernel.backward(torch.ones_like(out), q, k, v, out, lse, **masking)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the probe counts every failure
            errors.append(f"case {index}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}")
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - began)
            if mode == "target-reset":
                torch._dynamo.reset()
                torch.cuda.empty_cache()
            held.append(_held_mib())
        worst = max(worst, _difference(q, k, v, out, case, masking["softmax_scale"]))
    counters = torch._dynamo.utils.counters["stats"]
    return {
        "mode": mode,
        "cases": count,
        "errors": errors,
        "graphs": counters.get("unique_graphs", 0),
        "seconds": time.perf_counter() - start,
        "slowest": slowest,
        "held_mib": held,
        "reserved_mib": torch.cuda.memory_reserved() / 2**20,
        "max_out_difference": worst,
    }


def _held_mib() -> float:
    """GPU memory this process holds, as ``nvidia-smi`` sees it (the CUDA context and loaded modules too)."""
    listing = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
    rows = (line.split(",") for line in listing.splitlines() if line.strip())
    return next((float(used) for pid, used in rows if int(pid) == os.getpid()), float("nan"))


def _difference(q, k, v, out, case, scale) -> float:
    """Largest |out - attention| against the bundled ``reference`` kernel run in float64."""
    from fa2_verify.kernels.reference import DEFERRED

    inputs = (t.double() for t in (q, k, v))
    expected, _lse = DEFERRED.forward(*inputs, softmax_scale=scale, window_size=tuple(case["window"]))
    return float((expected - out.double()).abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--modes", default=",".join(MODES[:3]), help=f"comma-separated, from {','.join(MODES)}")
    parser.add_argument("--out", default=None, help="directory for one JSON file per mode")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_mode(args.one, args.cases)))
        return 0
    modes = [mode for mode in args.modes.split(",") if mode]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        print(f"probe_flex_compile.py: --modes names {unknown}: use some of {','.join(MODES)}", file=sys.stderr)
        return 2
    children = {}
    for mode in modes:
        cache = tempfile.mkdtemp(prefix=f"flex-{mode}-")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TRITON_CACHE_DIR": f"{cache}/triton"}
        command = [sys.executable, __file__, "--one", mode, "--cases", str(args.cases)]
        children[mode] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    print("| mode | cases | raised | graphs | seconds | slowest case s | held MiB, first case -> last | "
          "reserved MiB | max out difference |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, child in children.items():
        stdout, stderr = child.communicate()
        if child.returncode != 0:
            print(f"| {mode} | exit {child.returncode}: {stderr.strip().splitlines()[-1:]} | | | | | | | |")
            continue
        result = json.loads(stdout.strip().splitlines()[-1])
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"{mode}.json"), "w") as handle:
                json.dump(result, handle, indent=1)
        print(
            f"| {mode} | {result['cases']} | {len(result['errors'])} | {result['graphs']} | {result['seconds']:.1f} "
            f"| {result['slowest']:.1f} | {result['held_mib'][0]:.0f} -> {result['held_mib'][-1]:.0f} "
            f"| {result['reserved_mib']:.0f} | {result['max_out_difference']:.2e} |"
        )
        for error in result["errors"]:
            print(f"    {mode}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
