#!/usr/bin/env bash
# KVCR's SGLang HiCache backend under the real sglang package: the
# tests/engines/test_sglang_*.py suite, run by the real-engine virtual
# environment's python (scripts/engines-env.sh makes it; KVCR_ENGINES_VENV
# names another). Non-zero when a test fails or the venv is missing.
#
#   scripts/test-sglang.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KVCR_ENGINES_VENV:-/var/cache/kvcr/engines/venv}
PY=$VENV/bin/python
if [ ! -x "$PY" ]; then
  echo "test-sglang.sh: no engines venv at $VENV (scripts/engines-env.sh makes it)" >&2
  exit 1
fi

echo "== SGLang HiCache backend (real sglang, $("$PY" -c 'import importlib.metadata as m; print("sglang", m.version("sglang"), "torch", m.version("torch"))')) =="
start=$SECONDS
"$PY" -m pytest -q -p no:cacheprovider tests/engines/test_sglang_*.py "$@"
echo "test-sglang.sh: passed in $((SECONDS - start)) s"
