#!/usr/bin/env bash
# On the GPU machine: build the real flash-attn 2.8 (FlashAttention-2, CUDA) from
# its source distribution for Hopper only, optionally for a subset of its
# head-dim templates, so the build fits the device budget.
#   .fa2src/flash_attn-$FA2_FLASH_ATTN_VERSION.tar.gz   the sdist (carried; fetch it
#       here with lab/third-party/fetch-flash-attn-source.sh: the GPU machine has no network)
#   FA2_FLASH_ATTN_HEAD_DIMS  templates to build, ascending (default "64 128";
#       flash-attn's own set is "32 64 96 128 192 256").  flash-attn runs head dim d
#       on the smallest template >= d and sizes its buffers by d rounded up to that
#       template, so a head dim whose template is not built is refused (a
#       TORCH_CHECK in the head-dim switch) rather than run on a larger template.
#   FA2_FLASH_ATTN_BUILD  build folder (default /root/fa2build); ninja resumes
#       there, so a build cut off by a call's time limit goes on in the next call
#       on the same warm machine.
# Prints the two exports that make the build importable and declare its head
# dims (FA2_FLASH_ATTN_HEAD_DIMS) to fa2-verify's flash-attn target.  Exit status 0 once it imports.
set -euo pipefail
cd "$(dirname "$0")/../.."
version="${FA2_FLASH_ATTN_VERSION:-2.8.3}"
read -ra dims <<<"${FA2_FLASH_ATTN_HEAD_DIMS:-64 128}"
build="${FA2_FLASH_ATTN_BUILD:-/root/fa2build}"
source_dir="$build/flash_attn-$version"
largest="${dims[-1]}"
built_for() {  # the template itself where it is built, else the largest built one (never reached: refused first)
    if [[ " ${dims[*]} " == *" $1 "* ]]; then echo "$1"; else echo "$largest"; fi
}
# The head dims this build runs: multiples of 8 whose flash-attn template is built.
declared=""
previous=0
for template in 32 64 96 128 192 256; do
    if [[ " ${dims[*]} " == *" $template "* ]]; then
        for ((dim = previous + 8; dim <= template; dim += 8)); do declared+="${declared:+,}$dim"; done
    fi
    previous=$template
done
if [[ ! -d "$source_dir" ]]; then
    mkdir -p "$build"
    tar xzf ".fa2src/flash_attn-$version.tar.gz" -C "$build"
    keep="$(printf '%s|' "${dims[@]}")"
    # Only the kept templates' translation units stay in the extension's sources.
    sed -i -E "/csrc\/flash_attn\/src\/flash_(fwd|bwd|fwd_split)_hdim[0-9]+_/{/_hdim(${keep%|})_/!d}" "$source_dir/setup.py"
    # HEADDIM_SWITCH keeps flash-attn's templates; one that is not built refuses the call.
    switch="#define HEADDIM_SWITCH(HEADDIM, ...) [&] { "
    for template in 32 64 96 128 192 256; do
        switch+="if (HEADDIM <= $template) { "
        [[ " ${dims[*]} " == *" $template "* ]] ||
            switch+="TORCH_CHECK(false, \"head dim template $template is not built\"); "
        switch+="constexpr static int kHeadDim = $(built_for "$template"); return __VA_ARGS__(); } "
    done
    switch+="constexpr static int kHeadDim = $largest; return __VA_ARGS__(); }()"
    python3 - "$source_dir/csrc/flash_attn/src/static_switch.h" "$switch" <<'PY'
import sys
path, switch = sys.argv[1], sys.argv[2]
text = open(path).read()
start = text.index("#define HEADDIM_SWITCH")
end = text.index("}()", start) + 3
open(path, "w").write(text[:start] + switch + text[end:])
PY
fi
cd "$source_dir"
echo "building flash-attn $version for sm_90, head-dim templates ${dims[*]}: $(grep -cE 'flash_(fwd|bwd|fwd_split)_hdim' setup.py) CUDA sources"
FLASH_ATTN_CUDA_ARCHS=90 FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-$(nproc)}" NVCC_THREADS="${NVCC_THREADS:-2}" \
    python3 setup.py build_ext --inplace >"$build/build.log" 2>&1 || { tail -n 30 "$build/build.log"; exit 1; }
PYTHONPATH="$source_dir" python3 -c 'import flash_attn, flash_attn_2_cuda; print("flash-attn", flash_attn.__version__, "imports")'
echo "export PYTHONPATH=$source_dir\${PYTHONPATH:+:\$PYTHONPATH} FA2_FLASH_ATTN_HEAD_DIMS=$declared"
