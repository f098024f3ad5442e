#!/usr/bin/env bash
# The main job: set-up, then `kvcr demo` — a router and three engine
# processes sharing KV blocks peer to peer (arguments go to the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/tools/kvcr demo "$@"
