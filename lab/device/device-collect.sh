#!/usr/bin/env bash
# Waits for a detached lab/device/device-steps.sh run and brings back what it has done so far:
# `lab/device/device-collect.sh DIR SECONDS` waits until DIR/done exists or SECONDS pass, then packs
# DIR (caches and example databases aside) into $OUT/steps.tgz and prints DIR/steps.txt.
# A detached run lives only while a device call is in flight, so the calls that collect it
# follow each other back to back.
set -uo pipefail
dir="$1" wait="${2:-540}"
for ((elapsed = 0; elapsed < wait; elapsed += 10)); do
    [[ -e "$dir/done" ]] && break
    sleep 10
done
tar czf "$OUT/steps.tgz" --exclude='*-cache' --exclude='examples-*' -C "$dir" .
cat "$dir/steps.txt" 2>/dev/null
find "$dir" -maxdepth 2 -type f -printf "%TH:%TM %10s %p\n" | sort | tail -n 30
nvidia-smi --query-gpu=memory.used --format=csv,noheader
