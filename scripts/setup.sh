#!/usr/bin/env bash
# Installs what KVCR needs on Debian 12 and builds it into build/.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  libxxhash-dev libcmocka-dev
  libucx-dev libzmq3-dev libmsgpack-dev libjansson-dev liburing-dev
  libhiredis-dev redis-server fio valgrind prometheus iperf3 ucx-utils iproute2 nftables
  python3-dev python3-pytest python3-pip python3-setuptools
)

source scripts/debian-packages.sh
ensure_debian_packages setup "${PACKAGES[@]}"

build() { # build DIR [cmake args...]
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir"
}

build build -DCMAKE_BUILD_TYPE=Release
if [ "${KVCR_SETUP_INSTALL:-1}" = 1 ]; then
  cmake --install build >/dev/null
  ldconfig 2>/dev/null || true
fi
if [ -x scripts/install-python.sh ]; then
  scripts/install-python.sh
fi
