# shellcheck shell=bash disable=SC2034  # plugin is read by the scripts that source this file
# Sourced by the lab/device/device-*.sh scripts, from the repository root, on a GPU
# machine with no install step: fa2-verify runs from the source tree (on
# PYTHONPATH, output unbuffered), with the dependencies the image lacks
# (lab/device/device-deps.sh); `plugin` holds the pytest arguments that load the
# property suite's plugin: `-p fa2_verify.properties.plugin` from the source
# tree, nothing where fa2-verify is installed (its pytest11 entry point loads
# it, and naming it again is an error).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck source=lab/device/device-deps.sh
source lab/device/device-deps.sh
plugin=(-p fa2_verify.properties.plugin)
# issue 30's six long scale cases (app.cases.scale), timed by several scripts
long_cases=(s16384-none-fp16 s16384-hd256-gqa8-causal-bf16 sk65537-none-fp16 s65537-window-bf16
    s131072-causal-bf16 sk131072-none-fp16)
if python3 -c 'import importlib.metadata as m, sys; sys.exit(not any(e.value == "fa2_verify.properties.plugin" for e in m.entry_points(group="pytest11")))'; then
    plugin=()
fi
