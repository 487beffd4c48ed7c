# shellcheck shell=bash
# Shared settings of the ci/*.sh scripts (sourced, not run).  Every value can be
# set from the environment, so the scripts run the same by hand and in CI:
#   FA2_KERNEL   kernel target (default: triton)
#   FA2_DEVICE   cpu or cuda (default: cuda when nvidia-smi sees a GPU, else cpu)
#   FA2_OUT      output directory (default: ci-out/$FA2_KERNEL)
#   FA2_VENV     virtual environment made by ci/setup.sh (default: .venv)
#   FA2_PROFILE  property-suite profile: dev, ci or nightly (default: dev)

gpu_count() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L | wc -l
    else
        echo 0
    fi
}

# Short name of the first GPU for baseline file names: "NVIDIA H100 80GB HBM3" -> h100.
gpu_tag() {
    local name tag
    name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    tag="$(grep -oiE '\b[a-z][0-9]{2,4}\b' <<<"$name" | head -n 1 | tr '[:upper:]' '[:lower:]' || true)"
    if [[ -z "$tag" ]]; then
        tag="$(tr '[:upper:]' '[:lower:]' <<<"$name" | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')"
    fi
    echo "$tag"
}

FA2_KERNEL="${FA2_KERNEL:-triton}"
if [[ -z "${FA2_DEVICE:-}" ]]; then
    if [[ "$(gpu_count)" -gt 0 ]]; then FA2_DEVICE=cuda; else FA2_DEVICE=cpu; fi
fi
FA2_OUT="${FA2_OUT:-ci-out/$FA2_KERNEL}"
FA2_VENV="${FA2_VENV:-.venv}"
FA2_PROFILE="${FA2_PROFILE:-dev}"
PYTHON="$FA2_VENV/bin/python"
FA2_VERIFY="$FA2_VENV/bin/fa2-verify"
export FA2_KERNEL FA2_DEVICE FA2_OUT FA2_VENV FA2_PROFILE PYTHON FA2_VERIFY
mkdir -p "$FA2_OUT"
