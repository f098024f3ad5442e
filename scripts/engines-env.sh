#!/usr/bin/env bash
# Makes the real-engine environment the engine tests run in: a virtual
# environment with vLLM's CPU build, torch, transformers, msgspec, pyzmq
# (requirements/engines.txt), SGLang (requirements/sglang.txt) and this
# tree's kvcr, plus the `vllm` package of each other vLLM release whose KVCR
# adapter we test (requirements/vllm-revisions.txt), unpacked beside it.
#
#   scripts/engines-env.sh            # prints the venv's python (the only line
#                                     # on stdout; progress goes to stderr)
#
# Where: KVCR_ENGINES_DIR (default /var/cache/kvcr/engines), outside the
# work tree so that a fresh clone on the same machine reuses it. Idempotent:
# each part carries a stamp of the files that define it (and of the kvcr
# sources, for kvcr), and a part whose stamp matches installs nothing.
# Everything comes from the Python package registry by exact version, with
# --no-deps: the lock files are the whole dependency set.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${KVCR_ENGINES_DIR:-/var/cache/kvcr/engines}
VENV=$DIR/venv
REVISIONS=$DIR/vllm-revisions
PY=/usr/bin/python3

PACKAGES=(python3-venv python3-dev build-essential cmake ninja-build pkg-config
          libxxhash-dev libucx-dev libzmq3-dev libmsgpack-dev liburing-dev unzip)
source scripts/debian-packages.sh
ensure_debian_packages engines-env "${PACKAGES[@]}"

stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
stamp_matches() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }
log() { echo "engines-env: $*" >&2; }

# The registry packages: made anew when a lock file changes, so that a
# package dropped from a lock does not linger.
make_venv() {
  local want
  want=$(stamp_of requirements/engines.txt requirements/sglang.txt <(echo "$($PY -V)"))
  if stamp_matches "$VENV/.kvcr-packages" "$want"; then
    log "packages up to date in $VENV"
    return
  fi
  log "making $VENV"
  local start=$SECONDS
  rm -rf "$VENV"
  mkdir -p "$DIR"
  $PY -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check pip==25.3 >&2
  "$VENV/bin/pip" install -q --no-deps -r requirements/engines.txt >&2
  "$VENV/bin/pip" install -q --no-deps -r requirements/sglang.txt >&2
  echo "$want" > "$VENV/.kvcr-packages"
  log "packages installed in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
}

# Our package, built from this tree: again only when its sources changed.
install_kvcr() {
  local want
  want=$(git ls-files -z -- setup.py CMakeLists.txt cmake include src python \
           | xargs -0 cat | sha256sum | cut -d' ' -f1)
  if stamp_matches "$VENV/.kvcr-self" "$want"; then
    log "kvcr up to date in $VENV"
    return
  fi
  log "building and installing kvcr into $VENV"
  local work
  work=$(mktemp -d)
  KVCR_CMAKE_BUILD_DIR="$work/cmake" KVCR_BUILD_JOBS="${KVCR_BUILD_JOBS:-$(nproc)}" \
    "$VENV/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall . >&2
  rm -rf "$work"
  (cd / && "$VENV/bin/python" -c "import kvcr._native")
  echo "$want" > "$VENV/.kvcr-self"
}

# Other vLLM releases: only their `vllm` Python package, unpacked into a
# folder of its own, put ahead of the venv's vLLM with PYTHONPATH by the
# tests that load that release's KVCR adapter. Compiled modules are left
# out: those tests import vLLM's Python tiering framework, no kernel.
unpack_revisions() {
  local want line name version sha wheel dest
  want=$(stamp_of requirements/vllm-revisions.txt)
  if stamp_matches "$REVISIONS/.kvcr-revisions" "$want"; then
    log "vLLM revisions up to date in $REVISIONS"
    return
  fi
  rm -rf "$REVISIONS"
  mkdir -p "$REVISIONS/wheels"
  while read -r line; do
    line=${line%%#*}
    [ -n "${line// }" ] || continue
    read -r name version sha <<<"$line"
    log "unpacking $name $version"
    "$VENV/bin/pip" download -q --no-deps -d "$REVISIONS/wheels" "$name==$version" >&2
    wheel=$(ls "$REVISIONS/wheels/${name//-/_}-$version-"*.whl)
    if [ "$(sha256sum "$wheel" | cut -d' ' -f1)" != "$sha" ]; then
      echo "engines-env: $wheel does not have the sha256 pinned in requirements/vllm-revisions.txt" >&2
      exit 1
    fi
    dest="$REVISIONS/$version"
    mkdir -p "$dest"
    unzip -q -o "$wheel" 'vllm/*' -x '*.so' -d "$dest"
    rm -f "$wheel"
  done < requirements/vllm-revisions.txt
  echo "$want" > "$REVISIONS/.kvcr-revisions"
}

make_venv
install_kvcr
unpack_revisions
echo "$VENV/bin/python"
