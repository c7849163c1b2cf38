#!/usr/bin/env bash
# Build the CPU-only vLLM environments of the real-vLLM test tier (tests/vllm_tier, docs/cpu-tiers.md).
#
# One venv per vLLM release under $VLLM_ENVS_DIR (default ${XDG_CACHE_HOME:-~/.cache}/mla_fp8_bench/vllm-envs):
#   vllm-<ver>/  Python 3.11, torch==2.13.0 (CPU), numpy, `pip install --no-deps vllm==<ver>`, the
#                small packages vLLM's import chain needs, xgrammar + apache-tvm-ffi (--no-deps, so
#                triton is not pulled), and vLLM's CUDA .so files deleted (they never load on CPU).
# pip reports conflicts with vLLM's declared pins (torch,
# transformers, xgrammar, ...) and exits 0: expected, the import works.
#
# A healthy env (marker file written last + a smoke import) is reused; anything else is rebuilt.
# The project itself is NOT installed into the envs: the tier runs them with PYTHONPATH=<repo>, so a
# cached env never imports a stale checkout.
#
# Environment:
#   VLLM_ENVS_DIR        where the envs live (default ${XDG_CACHE_HOME:-~/.cache}/mla_fp8_bench/vllm-envs)
#   VLLM_TIER_VERSIONS   space-separated releases (default "0.28.0 0.33.0")
#   VLLM_TIER_PYTHON     base interpreter (default python3.11)
#   VLLM_TIER_SERIAL=1   build one env at a time (default: in parallel)
#
# Usage: bash scripts/vllm_envs.sh [--rebuild | --print-dir]  (--print-dir: where the envs live, nothing built)
set -euo pipefail

ENVS_DIR="${VLLM_ENVS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mla_fp8_bench/vllm-envs}"
[[ "${1:-}" == "--print-dir" ]] && { echo "$ENVS_DIR"; exit 0; }
VERSIONS="${VLLM_TIER_VERSIONS:-0.28.0 0.33.0}"
PY="${VLLM_TIER_PYTHON:-python3.11}"
REBUILD=0
[[ "${1:-}" == "--rebuild" ]] && REBUILD=1
# Bump when the recipe changes: envs carrying another stamp are rebuilt.
RECIPE="vllm-tier-recipe-1 torch==2.13.0"
SMALL_PKGS=(packaging regex requests psutil pyzmq pydantic cbor2 transformers aiohttp openai-harmony openai
            pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus-client fastapi
            partial-json-parser llguidance einops)

command -v "$PY" >/dev/null || { echo "vllm_envs.sh: base interpreter '$PY' not found (set VLLM_TIER_PYTHON)" >&2; exit 2; }
mkdir -p "$ENVS_DIR"

healthy() {  # $1 env dir, $2 version
    local env="$1" ver="$2"
    [[ -f "$env/.vllm-tier-ok" ]] && [[ "$(cat "$env/.vllm-tier-ok")" == "$RECIPE vllm==$ver" ]] || return 1
    VLLM_TARGET_DEVICE=cpu "$env/bin/python" - "$ver" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("vllm") == sys.argv[1], version("vllm")
import torch
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
import vllm.v1.attention.backends.mla.rocm_aiter_mla  # noqa: F401
import vllm.v1.worker.workspace  # noqa: F401
EOF
}

build() {  # $1 version
    local ver="$1" env="$ENVS_DIR/vllm-$1" t0=$SECONDS
    if [[ $REBUILD == 0 ]] && healthy "$env" "$ver"; then
        echo "[vllm_envs] vllm-$ver: healthy, reused ($env)"
        return 0
    fi
    echo "[vllm_envs] vllm-$ver: building $env"
    rm -rf "$env"
    step() {  # $1 label, rest: command; prints the step's duration
        local label="$1" s=$SECONDS; shift
        "$@"
        echo "[vllm_envs] vllm-$ver: $label $((SECONDS - s)) s"
    }
    local pip=("$env/bin/python" -m pip install --disable-pip-version-check -q)
    step venv "$PY" -m venv "$env"
    step torch "${pip[@]}" torch==2.13.0 numpy
    step vllm "${pip[@]}" --no-deps "vllm==$ver"
    step deps "${pip[@]}" "${SMALL_PKGS[@]}"
    step xgrammar "${pip[@]}" --no-deps xgrammar apache-tvm-ffi
    local site
    site="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    find "$site/vllm" -name '*.so' -delete
    echo "$RECIPE vllm==$ver" > "$env/.vllm-tier-ok"
    if ! healthy "$env" "$ver"; then
        rm -f "$env/.vllm-tier-ok"
        echo "[vllm_envs] vllm-$ver: built but the smoke import failed:" >&2
        VLLM_TARGET_DEVICE=cpu "$env/bin/python" -c "import vllm.v1.attention.backends.mla.rocm_aiter_mla" >&2 || true
        return 1
    fi
    echo "[vllm_envs] vllm-$ver: built in $((SECONDS - t0)) s, $(du -sh "$env" | cut -f1)"
}

t_all=$SECONDS
status=0
if [[ "${VLLM_TIER_SERIAL:-0}" == 1 ]]; then
    for v in $VERSIONS; do build "$v" || status=1; done
else
    pids=()
    for v in $VERSIONS; do
        build "$v" > "$ENVS_DIR/build-$v.log" 2>&1 &
        pids+=("$!:$v")
    done
    for pv in "${pids[@]}"; do
        if ! wait "${pv%%:*}"; then
            status=1
            echo "[vllm_envs] vllm-${pv#*:}: FAILED; last lines of $ENVS_DIR/build-${pv#*:}.log:" >&2
            tail -n 30 "$ENVS_DIR/build-${pv#*:}.log" >&2
        fi
        grep '^\[vllm_envs\]' "$ENVS_DIR/build-${pv#*:}.log" || true
    done
fi
echo "[vllm_envs] done in $((SECONDS - t_all)) s; $(du -sh "$ENVS_DIR" | cut -f1) in $ENVS_DIR"
exit $status
