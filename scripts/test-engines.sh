#!/usr/bin/env bash
# The real-engine tests: makes (or finds) the engine environment
# (scripts/engines-env.sh), runs every tests/engines test in it — vLLM's CPU
# build with its own KVCR adapter, SGLang's HiCache, the end-to-end runs,
# KVCR's KV events decoded by vLLM's own structs — then vLLM's KVCR adapter
# tests once more for each other vLLM release in
# requirements/vllm-revisions.txt, that release's `vllm` package put first
# on the path.
set -euo pipefail
cd "$(dirname "$0")/.."

python=$(scripts/engines-env.sh)
revisions=${KVCR_ENGINES_DIR:-/var/cache/kvcr/engines}/vllm-revisions
# No model hub here: the tests make their own tiny model and tokenizer.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

run_pytest() { # DIR LABEL [pytest args...]; pytest's "no tests ran" (5) is a failure too
  local dir=$1 label=$2; shift 2
  echo "== engine tests: $label =="
  (cd "$dir" && "$python" -m pytest -q -p no:cacheprovider "$@")
}

run_pytest tests/engines "$("$python" -c 'import vllm; print("vllm", vllm.__version__)')" .
# The routers' check of KVCR's events with vLLM's own kv_events structs.
run_pytest tests/routers "vLLM's kv_events structs" test_vllm_msgspec.py

while read -r name version _; do
  [ -n "$name" ] && [ "${name#\#}" = "$name" ] || continue
  KVCR_EXPECT_VLLM=$version PYTHONPATH="$revisions/$version" \
    run_pytest tests/engines "$name $version's KVCR adapter" test_vllm_tier_adapter.py
done < requirements/vllm-revisions.txt
