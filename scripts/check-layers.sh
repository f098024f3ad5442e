#!/usr/bin/env bash
# The layer rules of docs/ARCHITECTURE.md, checked on the tree and on a
# build of it:
#   (a) includes go one way, folder by folder (MAY_INCLUDE below): util <-
#       net <- core <- tiers <- api, the engine's side of guard mode
#       (src/client) under api, the daemon (src/daemon) beside, reaching the
#       library only through api/boot.h and the guard-mode protocol; the
#       Python extension includes include/ alone, the tool and the benches
#       only the src/ modules they link (PROGRAM_SRC_HEADERS);
#   (b) the symbol rule: every global symbol that libkvcr.a and libkvcr.so
#       define starts with kvcr_ (public) or kvcr__ (internal);
#   (c) no source file over 1,500 lines;
#   (d) every ctest of the build has a label.
# Every violation is printed; the exit status is 1 if there was any.
#
#   scripts/check-layers.sh [BUILD_DIR]     # default: build
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

MAX_LINES=1500
violations=0
violation() {
  echo "check-layers: $*"
  violations=$((violations + 1))
}

# The project headers a file includes ("dir/name.h" that exist under src/).
src_includes() { # FILE
  sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$1" |
    while read -r inc; do if [ -f "src/$inc" ]; then echo "$inc"; fi; done
}

# Every project header a header pulls in, itself included.
closure() { # HEADER (relative to src/)
  local todo=("$1") seen=" " h
  while [ ${#todo[@]} -gt 0 ]; do
    h=${todo[0]}
    todo=("${todo[@]:1}")
    case "$seen" in *" $h "*) continue ;; esac
    seen="$seen$h "
    echo "$h"
    for inc in $(src_includes "src/$h"); do todo+=("$inc"); done
  done
}

# ---- (a) include rules -----------------------------------------------------------

# What the files of each src/ folder may include from src/ besides their own
# folder: a folder (any of its headers) or one header. A folder without a
# row is a violation: a new folder states its place here and in
# docs/ARCHITECTURE.md.
declare -A MAY_INCLUDE=(
  [util]=""
  [net]="util"
  [core]="util net"
  [policy]="util"
  [tiers]="util net core/tier.h core/host.h core/conf.h"
  [client]="util net core/recovery.h"
  [api]="util net core policy tiers client"
  [daemon]="util net client/frame.h client/journal.h client/pool.h $(closure api/boot.h | paste -sd ' ')"
)

check_include() { # FILE (relative to src/) INCLUDED (relative to src/)
  local f=$1 inc=$2 from=${1%%/*} to=${2%%/*}
  [ "$from" != "$to" ] || return 0
  if [ -z "${MAY_INCLUDE[$from]+set}" ]; then
    violation "src/$f: src/$from has no row in MAY_INCLUDE (scripts/check-layers.sh)"
    return
  fi
  case " ${MAY_INCLUDE[$from]} " in *" $to "* | *" $inc "*) return 0 ;; esac
  violation "src/$f includes \"$inc\": src/$from includes from src/ only ${MAY_INCLUDE[$from]:-its own folder}"
}

while IFS= read -r path; do
  f=${path#src/}
  for inc in $(src_includes "$path"); do check_include "$f" "$inc"; done
done < <(find src -name '*.[ch]' | sort)

# Programs of the library include include/ and, from src/, only the modules
# they link themselves (tools/CMakeLists.txt, bench/CMakeLists.txt): the
# daemon, the G3 store and the KV-event decoder (kvcr_shared), the logging
# libkvcr exports. The Python extension includes include/ alone.
declare -A PROGRAM_SRC_HEADERS=(
  [tools]="daemon/service.h tiers/g3_store.h util/log.h net/kvev.h"
  [bench]="daemon/service.h tiers/g3_store.h util/log.h"
  [python]=""
)
while IFS= read -r path; do
  prog=${path%%/*}
  for inc in $(src_includes "$path"); do
    case " ${PROGRAM_SRC_HEADERS[$prog]} " in
      *" $inc "*) ;;
      *) violation "$path includes \"$inc\": $prog/ includes from src/ only ${PROGRAM_SRC_HEADERS[$prog]:-nothing}" ;;
    esac
  done
done < <(find tools bench python -name '*.[ch]' | sort)

# ---- (b) the symbol rule ---------------------------------------------------------

check_symbols() { # LIBRARY NM-ARGS...
  local lib=$1; shift
  if [ ! -f "$lib" ]; then
    violation "$lib is missing (build first: cmake --build $build)"
    return
  fi
  # ASan's ODR indicators (__odr_asan.<global>) carry the global's name.
  local sym
  while read -r sym; do
    violation "$lib defines the global symbol $sym (neither kvcr_ nor kvcr__)"
  done < <(nm "$@" --defined-only "$lib" | awk 'NF == 3 { print $3 }' |
           sed 's/^__odr_asan\.//' | grep -v '^kvcr_' | sort -u)
}
check_symbols "$build/libkvcr.a" -g
check_symbols "$build/libkvcr.so" -D

# Every ctest has a label (unit, integration, ...: tests/CMakeLists.txt).
if [ -f "$build/CTestTestfile.cmake" ]; then
  while read -r name; do
    violation "the ctest $name has no label"
  done < <(ctest --test-dir "$build" --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    if not props.get("LABELS"):
        print(t["name"])')
fi

# ---- (c) file length -------------------------------------------------------------

while IFS= read -r path; do
  n=$(wc -l < "$path")
  [ "$n" -le "$MAX_LINES" ] || violation "$path has $n lines (at most $MAX_LINES)"
done < <(find src tools bench tests python -name '*.[ch]' -not -path '*/corpus/*' | sort)

if [ "$violations" -gt 0 ]; then
  echo "check-layers: $violations violation(s) of the layer rules (docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "check-layers: include rules, symbol rule, file lengths and test labels hold"
