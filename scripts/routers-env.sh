#!/usr/bin/env bash
# Makes the virtual environment of the routers' tests (tests/routers): the
# real consumers of KVCR's KV events (requirements/routers.txt: Dynamo's
# runtime with its KV indexer, msgspec for vLLM's structs, pyzmq, msgpack)
# and our kvcr package built from this tree, with the `kvcr` command
# ($VENV/bin/kvcr) for its service.
#
#   scripts/routers-env.sh                 # prints the environment's python
#   KVCR_ROUTERS_VENV=/some/dir scripts/routers-env.sh
#
# The environment lives at a fixed path a CI cache can keep
# (/var/cache/kvcr/routers-venv unless KVCR_ROUTERS_VENV says otherwise) and
# is made idempotently: the requirements are installed again only when the
# sha256 of requirements/routers.txt differs from the stamp left by the
# last install, and kvcr only when the sha256 of its sources does. A second
# run with nothing changed installs nothing. Needs Debian's python3-venv and
# the build dependencies of scripts/install-python.sh, and the Python
# package registry for the first run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KVCR_ROUTERS_VENV:-/var/cache/kvcr/routers-venv}
PY_BASE=${KVCR_ROUTERS_PYTHON:-/usr/bin/python3}
REQ=requirements/routers.txt

source scripts/debian-packages.sh
ensure_debian_packages routers-env python3-venv python3-dev build-essential cmake ninja-build \
  pkg-config libxxhash-dev libucx-dev libzmq3-dev libmsgpack-dev liburing-dev

log() { echo "routers-env: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV from $PY_BASE"
  mkdir -p "$(dirname "$VENV")"
  "$PY_BASE" -m venv "$VENV"
fi
PY="$VENV/bin/python"

req_sum=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ "$(cat "$VENV/.kvcr-requirements.sha256" 2>/dev/null)" != "$req_sum" ]; then
  log "installing $REQ"
  "$PY" -m pip install -q --disable-pip-version-check --require-virtualenv -r "$REQ"
  echo "$req_sum" >"$VENV/.kvcr-requirements.sha256"
else
  log "requirements up to date ($req_sum)"
fi

# What the kvcr package is built from: a change in any of these rebuilds it.
src_sum=$(find CMakeLists.txt cmake include src python setup.py setup.cfg -type f \
            -not -name '*.pyc' -not -path '*/__pycache__/*' -not -path '*.egg-info/*' -print0 | LC_ALL=C sort -z |
          xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.kvcr-package.sha256" 2>/dev/null)" != "$src_sum" ]; then
  log "building and installing kvcr from $(pwd)"
  # Built from a copy kept with the environment (mtimes kept, so the CMake
  # build directory beside it recompiles only what changed), so that
  # nothing is written into the tree other engineers build in.
  rm -rf "$VENV/.kvcr-src"
  mkdir -p "$VENV/.kvcr-src"
  cp -a CMakeLists.txt cmake include src python setup.py setup.cfg tools bench "$VENV/.kvcr-src/"
  [ -f README.md ] && cp -a README.md "$VENV/.kvcr-src/"
  (cd "$VENV/.kvcr-src" &&
   KVCR_CMAKE_BUILD_DIR="$VENV/.kvcr-cmake" KVCR_BUILD_JOBS="${KVCR_BUILD_JOBS:-2}" \
     "$PY" -m pip install -q --disable-pip-version-check --require-virtualenv \
     --no-build-isolation --no-deps --no-index --force-reinstall .)
  # The `kvcr` command too (its service: the Guard the tests SIGKILL an
  # engine under), from the same CMake build.
  cmake --build "$VENV/.kvcr-cmake" --target kvcr_tool -j "${KVCR_BUILD_JOBS:-2}" >/dev/null
  install -m 755 "$VENV/.kvcr-cmake/tools/kvcr" "$VENV/bin/kvcr"
  echo "$src_sum" >"$VENV/.kvcr-package.sha256"
else
  log "kvcr up to date ($src_sum)"
fi
(cd / && "$PY" -c "import kvcr._native, msgspec, zmq, msgpack, dynamo._core") >&2
echo "$PY"
