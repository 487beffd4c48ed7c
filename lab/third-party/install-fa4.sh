#!/usr/bin/env bash
# On the GPU machine: install FlashAttention-4 from the wheels lab/third-party/fetch-fa4-wheels.sh
# split into .whl-a and .whl-b.  Run it in two consecutive device calls on the
# same warm machine, the first carrying .whl-a, the second .whl-b; each call
# stages what it carries in $FA2_FA4_STAGE (default /root/fa4), and the call
# that completes the set installs into $FA2_FA4_SITE (default /root/site).
# Then: export PYTHONPATH="$FA2_FA4_SITE:$FA2_FA4_SITE/nvidia_cutlass_dsl/dsl_packages"
# (a --target install does not process the meta wheel's .pth file).
set -euo pipefail
cd "$(dirname "$0")/../.."
stage="${FA2_FA4_STAGE:-/root/fa4}"
site="${FA2_FA4_SITE:-/root/site}"
mkdir -p "$stage"
for folder in .whl-a .whl-b; do
    [[ -d "$folder" ]] && cp "$folder"/* "$stage"/
done
if [[ ! -f "$stage/cu13.part.aa" || ! -f "$stage/cu13.part.ab" || ! -f "$stage/cu13.name" ]]; then
    echo "staged $(find "$stage" -type f | wc -l) file(s) in $stage; the other half comes with the next call"
    exit 0
fi
cat "$stage/cu13.part.aa" "$stage/cu13.part.ab" >"$stage/$(cat "$stage/cu13.name")"
rm "$stage"/cu13.part.* "$stage/cu13.name"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$stage"/*.whl
PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" python3 -c 'import flash_attn.cute, cutlass.cute; print("flash_attn.cute installed")'
