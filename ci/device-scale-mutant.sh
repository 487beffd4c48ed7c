#!/usr/bin/env bash
# One scale mutant on the one scale case it must fail, through `fa2-verify repro`
# (the run's whole scale set costs about 8 minutes per target on an H100):
#   ci/device-scale-mutant.sh MUTANT CASE_NAME
# MUTANT is a name of tests/mutants.py SCALE_MUTANTS, CASE_NAME a CUDA scale case
# (verify/scale_cases.py).  Exit status: repro's (1 when the case fails).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=ci/device-common.sh
source ci/device-common.sh
case_json="$(python3 - "$2" <<'PY'
import json, sys
from fa2_verify.verify.scale_cases import CUDA_CASES
cases = {case.name: case for case in CUDA_CASES}
if sys.argv[1] not in cases:
    sys.exit(f"{sys.argv[1]!r} is not a CUDA scale case: use one of {', '.join(cases)}")
print(json.dumps(cases[sys.argv[1]].to_dict()))
PY
)" || exit 2
python3 -m fa2_verify repro --kernel "tests.mutants:$1" --device cuda --case "$case_json"
