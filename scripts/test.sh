#!/usr/bin/env bash
# The whole test suite: set-up (which makes the release build), the layer
# rules on it (scripts/check-layers.sh), then the C tests in that release
# build, an ASan+UBSan build, a TSan build and under valgrind, bounded
# fuzzing, the Python tests, and last the stages with real packages from
# the registry, each in a cached virtual environment: the routers
# (scripts/test-routers.sh) and the engines, vLLM and SGLang
# (scripts/test-engines.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

jobs=$(nproc)
run_ctest() { # DIR [ctest args...]
  local dir=$1; shift
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 600 "$@")
}

echo "== layer rules (include rules, symbol rule, file lengths) =="
if ! scripts/check-layers.sh build; then
  echo "test.sh: the layer rules of docs/ARCHITECTURE.md are broken (each violation is above)" >&2
  exit 1
fi

echo "== C tests (release) =="
run_ctest build

echo "== C tests (ASan+UBSan) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVCR_SANITIZE=address >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp" run_ctest build-asan

echo "== C tests (TSan) =="
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVCR_SANITIZE=thread >/dev/null
cmake --build build-tsan
# libzmq is not built with TSan: its lock-free hand-off of each message to
# its I/O thread shows up as races inside libzmq (only frames in libzmq are
# suppressed). UCX's memory hooks patch madvise, which glibc calls at thread
# exit after TSan tore the thread down: the hooks are off for this run.
# The link-fault tests (test-rig-link-faults-*) run in the release and ASan
# builds only: they time deadlines and recoveries over whole seconds, run
# alone (RUN_SERIAL), and the threads they drive are the ones every other
# peer test runs under TSan here; this keeps the suite's time down.
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" UCX_MEM_MMAP_HOOK_MODE=none \
  run_ctest build-tsan -E 'rig-link-faults'

echo "== C tests (valgrind memcheck) =="
# Every test and every process it starts under memcheck: any error or any
# definite or indirect leak fails the test. The `kvcr` command is skipped
# where a test starts it (the service): valgrind 3.19 does not know
# pidfd_open, which the service needs. So is promtool (a Go program, which
# memcheck stops with an illegal instruction). The benchmark and demo runs are
# left to the other builds: they prove nothing more here, only slower. So are
# the tests on the netns rig (label rig): the rig joins and signals its hosts
# through pidfds, which valgrind 3.19 does not know (they would only skip).
cmake -S . -B build-valgrind -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CROSSCOMPILING_EMULATOR=valgrind;-q;--error-exitcode=99;--leak-check=full;--errors-for-leak-kinds=definite,indirect;--show-leak-kinds=definite,indirect;--trace-children=yes;--trace-children-skip=*/kvcr,*/promtool;--suppressions=$PWD/tests/valgrind.supp" \
  >/dev/null
cmake --build build-valgrind
# Left to the other builds as well: the Guard failover test (SIGKILLs and
# restarts, five minutes under valgrind, most of this stage's time) and the
# load test (eight flooding processes): their memory paths are the ones the
# other peer and service tests here exercise, and ASan checks them too.
(cd build-valgrind && ctest --output-on-failure -j "$jobs" --timeout 900 \
  -E 'bench|demo|test-service-guard-failover|test-remote-source-load' -LE rig)

echo "== fuzzing (libFuzzer, bounded) =="
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCR_BUILD_FUZZ=ON \
  -DKVCR_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz
for target in tests/fuzz/fuzz-*.c; do
  name=$(basename "$target" .c)
  work=$(mktemp -d)
  # New inputs go to a scratch corpus; the checked-in seeds stay as they are.
  if ! "build-fuzz/$name" -max_total_time="${KVCR_FUZZ_SECONDS:-20}" -print_final_stats=1 \
       "$work" "tests/fuzz/corpus/${name#fuzz-}" > "$work.log" 2>&1; then
    tail -40 "$work.log"
    echo "$name: the fuzzer found a failure" >&2
    exit 1
  fi
  echo "$name: $(grep -E 'stat::number_of_executed_units' "$work.log"), 0 crashes"
  rm -rf "$work" "$work.log"
done

if [ -d tests/python ]; then
  echo "== Python tests =="
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python
fi

echo "== peer and link-fault tests against UCX 1.22 (registry wheel) =="
# Debian 12's UCX 1.13.1 aborts on a peer that dies during TCP set-up: the
# scenarios it skips run here, against the modern UCX.
scripts/test-ucx-modern.sh

echo "== real routers (Dynamo's KV indexer, llm-d's rules) =="
scripts/test-routers.sh

echo "== real engines (vLLM, SGLang) =="
scripts/test-engines.sh
