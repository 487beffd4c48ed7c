# shellcheck shell=bash
# Sourced by lab/device/device-common.sh on the GPU machine, whose image lacks
# jsonschema (a dependency of fa2-verify): the wheels carried in .whl-c
# (jsonschema, jsonschema-specifications, referencing, rpds-py for Python 3.12,
# from `pip download --only-binary=:all:`) are installed into $FA2_DEPS_SITE
# (default /root/deps), which goes on PYTHONPATH.
deps_site="${FA2_DEPS_SITE:-/root/deps}"
if ! PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$deps_site" python3 -c 'import jsonschema' 2>/dev/null && compgen -G ".whl-c/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$deps_site" .whl-c/*.whl
fi
if [[ -d "$deps_site" ]]; then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$deps_site"
fi
