"""The autotuned Triton kernel the GPU suite-time run targets (tests/triton_autotuned.py) is a correct kernel:
under Triton's interpreter (a fresh process with ``TRITON_INTERPRET=1``, which Triton reads at import) it passes
a GQA case and a causal case whose first rows see no key."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("causal,seqlen_q,seqlen_k,heads_q,heads_kv", [(False, 50, 70, 4, 2), (True, 90, 70, 2, 1)])
def test_the_autotuned_kernel_passes(causal, seqlen_q, seqlen_k, heads_q, heads_kv):
    case = {"batch": 2, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "heads_q": heads_q, "heads_kv": heads_kv,
            "head_dim": 32, "dtype": "float16", "causal": causal, "seed": 5, "backward": False}
    environment = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    completed = subprocess.run(
        [sys.executable, "-m", "fa2_verify", "repro", "--kernel", "tests.triton_autotuned:AUTOTUNED", "--device",
         "cpu", "--case", json.dumps(case)], capture_output=True, text=True, env=environment, cwd=REPO, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "out (float16" in completed.stdout and "lse (float32" in completed.stdout
