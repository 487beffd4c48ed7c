#!/usr/bin/env bash
# Append the Markdown summaries in $FA2_OUT to the job summary ($GITHUB_STEP_SUMMARY),
# or print them when run by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

target="${GITHUB_STEP_SUMMARY:-/dev/stdout}"
found=0
for part in summary.md gate.md; do
    if [[ -f "$FA2_OUT/$part" ]]; then
        cat "$FA2_OUT/$part" >>"$target"
        echo >>"$target"
        found=1
    fi
done
if [[ "$found" -eq 0 ]]; then
    echo "no Markdown summary in $FA2_OUT (did ci/verify.sh and ci/gate.sh run?)" >>"$target"
fi
