#!/usr/bin/env bash
# The layer rules of docs/ARCHITECTURE.md, checked on the tree and on a
# build of it:
#   (a) includes go one way: util <- net <- core <- tiers <- api, the
#       daemon beside (src/service: service, guard, mirror, metrics_http)
#       reaching the library only through api/boot.h; the Python extension
#       includes include/ alone, the tool only the src/ modules it links;
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
DAEMON_FILES="service guard mirror metrics_http" # src/service/<name>.{c,h}
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

is_daemon() { # PATH (relative to src/)
  local name
  for name in $DAEMON_FILES; do
    case "$1" in "service/$name.c" | "service/$name.h") return 0 ;; esac
  done
  return 1
}

# ---- (a) include rules -----------------------------------------------------------

boot_closure=" $(closure api/boot.h | tr '\n' ' ') "

check_include() { # FILE (relative to src/) INCLUDED (relative to src/)
  local f=$1 inc=$2 from=${1%%/*} to=${2%%/*}
  local why=""
  case "$from" in
    util)
      [ "$to" = util ] || why="src/util includes no other src/ directory" ;;
    net)
      case "$to" in util | net) ;; *) why="src/net includes only src/util" ;; esac ;;
    core)
      case "$to" in tiers | service | api) why="src/core includes no header of src/$to" ;; esac ;;
    tiers)
      case "$inc" in
        core/tier.h | core/host.h | core/conf.h) ;;
        core/*) why="src/tiers include from src/core only core/tier.h, core/host.h, core/conf.h" ;;
        api/*) why="src/tiers include nothing from src/api" ;;
      esac ;;
    api)
      is_daemon "$inc" && why="src/api includes no header of the daemon (src/service: $DAEMON_FILES)" ;;
    service)
      if is_daemon "$f"; then
        case "$to" in
          core | api)
            case "$boot_closure" in
              *" $inc "*) ;;
              *) why="the daemon includes from src/core and src/api only api/boot.h (and what it includes)" ;;
            esac ;;
        esac
      elif is_daemon "$inc"; then
        why="libkvcr's side of src/service includes no header of the daemon"
      fi ;;
  esac
  # Only the daemon and the programs that link it include its headers.
  if [ -z "$why" ] && [ "$from" != service ] && is_daemon "$inc"; then
    why="only the daemon includes its own headers"
  fi
  if [ -n "$why" ]; then violation "src/$f includes \"$inc\": $why"; fi
}

while IFS= read -r path; do
  f=${path#src/}
  for inc in $(src_includes "$path"); do check_include "$f" "$inc"; done
done < <(find src -name '*.[ch]' | sort)

# Programs of the library: the Python extension includes include/ alone; the
# `kvcr` tool, besides include/, only the modules it links itself
# (tools/CMakeLists.txt): the daemon, the G3 store, the logging and the KV-event decoder.
TOOL_SRC_HEADERS=" service/service.h tiers/g3_store.h util/log.h net/kvev.h "
while IFS= read -r path; do
  for inc in $(src_includes "$path"); do
    case "$path:$TOOL_SRC_HEADERS" in
      tools/*" $inc "*) ;;
      tools/*) violation "$path includes \"$inc\": the tool includes from src/ only${TOOL_SRC_HEADERS% }" ;;
      *) violation "$path includes \"$inc\": the Python extension includes include/ alone" ;;
    esac
  done
done < <(find tools python -name '*.[ch]' | sort)

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
done < <(find src tools tests python -name '*.[ch]' -not -path '*/corpus/*' | sort)

if [ "$violations" -gt 0 ]; then
  echo "check-layers: $violations violation(s) of the layer rules (docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "check-layers: include rules, symbol rule, file lengths and test labels hold"
