#!/usr/bin/env bash
# GPU check: a kernel that faults the device is a verdict on its case, and the
# run goes on (docs/design.md, "A kernel that faults the device").  Runs
# `fa2-verify run --device cuda` on tests/out_of_bounds.py (the reference after
# a Triton store far past its tensor on head_dim 40 only) over three fixed
# cases; the second, fp32-none-gqa (head_dim 40), faults.  Expected: exit 1;
# on stderr "fa2-verify: the device faulted in case fp32-none-gqa
# (tests.out_of_bounds:KERNEL.forward faulted the device: ...: CUDA error: an
# illegal memory access was encountered); the cases after it run in a fresh
# process", then "running case 3 of 3: fp32-window-mqa"; on stdout the table
# with fp16-none-sk1 and fp32-window-mqa passed, fp32-none-gqa "error: ...
# faulted the device", its reproduction, and the summary "2 passed, 0 failed,
# 1 errors".  Prints "device-fault: ok" and exits 0 when all of that holds.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
out="$(mktemp -d)"
python3 -m fa2_verify run --device cuda --kernel tests.out_of_bounds:KERNEL --case fp16-none-sk1 \
    --case fp32-none-gqa --case fp32-window-mqa >"$out/stdout" 2>"$out/stderr"
status=$?
cat "$out/stdout" "$out/stderr"
fail() { echo "device-fault: FAILED: $1"; exit 1; }
((status == 1)) || fail "exit $status, expected 1"
grep -q "the device faulted in case fp32-none-gqa (.*illegal memory access" "$out/stderr" || fail "fault not named"
grep -q "running case 3 of 3: fp32-window-mqa" "$out/stderr" || fail "the case after the fault did not run"
grep -q "^fp32-none-gqa .*error: .*faulted the device" "$out/stdout" || fail "faulting case not in the table"
grep -q ": 2 passed, 0 failed, 1 errors" "$out/stdout" || fail "the other cases were not verified"
echo "device-fault: ok"
