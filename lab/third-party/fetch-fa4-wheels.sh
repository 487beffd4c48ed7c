#!/usr/bin/env bash
# Here, with network: download FlashAttention-4 (flash_attn.cute) and what it needs
# for the GPU machine (Python 3.12, x86-64, CUDA 13 torch there), and split them
# into two folders, each under a 64 MiB limit on what one call to the GPU machine carries:
#   .whl-a/  the small wheels and the first half of nvidia-cutlass-dsl-libs-cu13
#   .whl-b/  its second half
# Both folders must be ignored by git (.git/info/exclude) and are carried by two
# consecutive device calls on the same warm machine; lab/third-party/install-fa4.sh puts
# them together there.  The DSL's Python package (cutlass/cute) is in
# nvidia-cutlass-dsl-libs-core, which libs-base requires.
set -euo pipefail
cd "$(dirname "$0")/../.."
version="${FA2_FA4_VERSION:-4.0.0b36}"
dsl="${FA2_CUTLASS_DSL_VERSION:-4.8.1}"
work="$(mktemp -d)"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$work" \
    "flash-attn-4==$version" "nvidia-cutlass-dsl==$dsl" "nvidia-cutlass-dsl-libs-base==$dsl" \
    "nvidia-cutlass-dsl-libs-core==$dsl" "nvidia-cutlass-dsl-libs-cu13==$dsl" \
    quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
rm -rf .whl-a .whl-b
mkdir -p .whl-a .whl-b
big="$(ls "$work"/nvidia_cutlass_dsl_libs_cu13-*.whl)"
split -b 46000000 "$big" "$work/cu13.part."
mv "$work/cu13.part.aa" .whl-a/
mv "$work/cu13.part.ab" .whl-b/
rm "$big"
mv "$work"/*.whl .whl-a/
basename "$big" >.whl-a/cu13.name
du -sh .whl-a .whl-b
