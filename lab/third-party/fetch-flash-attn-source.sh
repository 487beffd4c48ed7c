#!/usr/bin/env bash
# Here, with network: download flash-attn's source distribution (it bundles CUTLASS)
# into .fa2src/ for lab/third-party/build-flash-attn.sh on the GPU machine.  .fa2src/ must be
# ignored by git and is carried by the device call (about 8.5 MB for 2.8.3).
set -euo pipefail
cd "$(dirname "$0")/../.."
version="${FA2_FLASH_ATTN_VERSION:-2.8.3}"
mkdir -p .fa2src
url="$(curl -fsSL https://pypi.org/simple/flash-attn/ | grep -oE "https://[^\"#]*flash_attn-$version\.tar\.gz" | head -n 1)"
curl -fsSL -o ".fa2src/flash_attn-$version.tar.gz" "$url"
ls -la .fa2src
