#!/usr/bin/env bash
# Install fa2-verify into a virtual environment and the Node tools of the report
# (Allure 3, playwright-core) into ci/node_modules.
#   FA2_TORCH  pip requirement for PyTorch (default: torch, the CUDA build on Linux;
#              use FA2_TORCH=torch==2.13.0 --index-url ... for another build)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

extras="test,reports,gpu"
if [[ "$FA2_DEVICE" == cpu ]]; then extras="test,reports,cpu-triton"; fi
if [[ ! -x "$PYTHON" ]]; then
    python3 -m venv "$FA2_VENV"
fi
"$PYTHON" -m pip install --upgrade pip
"$PYTHON" -m pip install "${FA2_TORCH:-torch}" -e ".[$extras]"
npm ci --prefix ci --no-audit --no-fund
"$FA2_VERIFY" kernels "$FA2_KERNEL"
