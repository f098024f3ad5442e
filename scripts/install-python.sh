#!/usr/bin/env bash
# Installs the kvcr Python package (libkvcr built with CMake and linked into
# the extension kvcr._native) into Debian's /usr/bin/python3 and, if it is a
# different interpreter, into the python3 on PATH. Nothing comes from PyPI:
# builds run without isolation on the installed setuptools, and Debian
# packages that are missing are installed with apt-get.
#
#   scripts/install-python.sh            # then, from any directory:
#   python3 -c "import kvcr; print(kvcr.__version__)"
#   /usr/bin/python3 -m pytest tests/python
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PY=/usr/bin/python3
PACKAGES=(python3-dev python3-pytest python3-pip python3-setuptools
          build-essential cmake ninja-build pkg-config libxxhash-dev
          libucx-dev libzmq3-dev libmsgpack-dev liburing-dev)

source scripts/debian-packages.sh
ensure_debian_packages install-python "${PACKAGES[@]}"

# One CMake build of libkvcr serves every interpreter; one compile job.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KVCR_CMAKE_BUILD_DIR="$work/cmake"
export KVCR_BUILD_JOBS="${KVCR_BUILD_JOBS:-1}"

install_into() { # PYTHON [extra pip flags...]
  local py=$1; shift
  echo "install-python: building and installing kvcr for $py"
  # Drop an earlier install first (an old egg would shadow the new one).
  "$py" -m pip uninstall -y -q "$@" kvcr >/dev/null 2>&1 || true
  if "$py" -m pip --version >/dev/null 2>&1 && "$py" -c "import wheel" >/dev/null 2>&1; then
    "$py" -m pip install -q --no-build-isolation --no-deps --no-index "$@" .
  else
    # No `wheel` package (PEP 517 builds need it): setuptools installs the
    # built tree directly, flat, as pip would.
    "$py" setup.py -q build_ext build --build-base "$work/build" \
      install --single-version-externally-managed --root=/ --record "$work/record.txt" >/dev/null
  fi
  (cd / && "$py" -c "import kvcr, kvcr._native; print('install-python: kvcr', kvcr.__version__, 'for', '$py', 'from', kvcr.__file__)")
}

install_into "$DEBIAN_PY" --break-system-packages

path_py=$(command -v python3 || true)
if [ -n "$path_py" ]; then
  prefix() { "$1" -c 'import sys; print(sys.prefix, sys.version)'; }
  if [ "$(prefix "$path_py")" != "$(prefix "$DEBIAN_PY")" ]; then
    install_into "$path_py"
  fi
fi
