#!/usr/bin/env bash
# The routers' tests: KVCR's KV events read by the real consumers' code
# (Dynamo's KV indexer, vLLM's msgspec structs, llm-d's decoding rules),
# tests/routers run by the python of the environment scripts/routers-env.sh
# makes (KVCR_ROUTERS_VENV, default /var/cache/kvcr/routers-venv).
#
#   scripts/test-routers.sh [pytest args...]
#
# Exits non-zero when a test fails, and when none was collected (pytest's
# exit status 5: a suite that runs nothing proves nothing).
set -euo pipefail
cd "$(dirname "$0")/.."

py=$(scripts/routers-env.sh)
set +e
(cd tests/routers && "$py" -m pytest -q -p no:cacheprovider "$@")
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test-routers: no test was collected" >&2
  exit 1
fi
exit "$rc"
