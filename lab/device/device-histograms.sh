#!/usr/bin/env bash
# lab/probes/probe_histograms.py on one GPU: ways to count a metric chunk's radix digits and fixed-edge bins
# (torch.bincount over 2^16 bins, copies of the histogram, sorts; bucketize against sums per edge), each checked
# against torch.bincount, on 2^24 float64 values of one and of twelve decades -> $OUT/histograms.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
python3 lab/probes/probe_histograms.py --device cuda 2>&1 | tee "$OUT/histograms.jsonl"
