#!/usr/bin/env bash
# Installs the kvcr Python package (with libkvcr compiled into its extension)
# into Debian's python3 and, if different, into the python3 on PATH.
# PyPI is not used: the build runs without isolation on installed tools.
set -euo pipefail
cd "$(dirname "$0")/.."

install_into() { # PYTHON [pip flags...]
  local py=$1; shift
  if "$py" -m pip --version >/dev/null 2>&1 && "$py" -c "import wheel" >/dev/null 2>&1; then
    "$py" -m pip install -q --no-build-isolation --no-deps "$@" . 
  else
    # No wheel package: setuptools installs the built tree directly.
    "$py" setup.py -q install --force >/dev/null
  fi
  (cd / && "$py" -c "import kvcr; print('kvcr', kvcr.__version__, 'for', '$py')")
}

install_into /usr/bin/python3 --break-system-packages
path_py=$(command -v python3 || true)
if [ -n "$path_py" ] && [ "$(readlink -f "$path_py")" != "$(readlink -f /usr/bin/python3)" ] &&
   [ "$("$path_py" -c 'import sys; print(sys.prefix)')" != "$(/usr/bin/python3 -c 'import sys; print(sys.prefix)')" ]; then
  install_into "$path_py"
fi
