#!/usr/bin/env bash
# The ABI test (ctest label abi): installs the build into a prefix inside
# the build directory, compiles tests/abi/abi-roundtrip.c against it the way
# an engine would (the installed include/ and `pkg-config --cflags --libs
# kvcr`, so the shared library), and runs it.
#
#   tests/abi/run.sh BUILD_DIR CC [EXTRA_CFLAGS...]   # e.g. -fsanitize=address
set -euo pipefail
build=$(cd "$1" && pwd)
cc=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)

prefix=$build/abi-prefix
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name kvcr.pc -print -quit)
[ -n "$pc" ] || { echo "run.sh: the install has no kvcr.pc" >&2; exit 1; }
pkg() { PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$prefix" "$@" kvcr; }
libdir=$(pkg --variable=libdir)

# shellcheck disable=SC2046 # pkg-config's flags are words
"$cc" -std=c11 -Wall -Wextra -Werror "$@" -o "$prefix/abi-roundtrip" "$here/abi-roundtrip.c" \
  $(pkg --cflags --libs) -Wl,-rpath,"$libdir"
"$prefix/abi-roundtrip" "$libdir"
