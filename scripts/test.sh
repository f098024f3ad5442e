#!/usr/bin/env bash
# The whole test suite: set-up, then the C tests in a release build, an
# ASan+UBSan build and a TSan build, then the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

jobs=$(nproc)
run_ctest() { # DIR
  (cd "$1" && ctest --output-on-failure -j "$jobs" --timeout 600)
}

echo "== C tests (release) =="
run_ctest build

echo "== C tests (ASan+UBSan) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVCR_SANITIZE=address >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 run_ctest build-asan

echo "== C tests (TSan) =="
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVCR_SANITIZE=thread >/dev/null
cmake --build build-tsan
TSAN_OPTIONS=halt_on_error=1 run_ctest build-tsan

if [ -d tests/python ]; then
  echo "== Python tests =="
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python
fi
