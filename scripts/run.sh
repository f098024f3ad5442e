#!/usr/bin/env bash
# The main job: set-up, then the local benchmark (the demo cluster arrives
# with the peer-to-peer tier).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/tools/kvcr bench local "$@"
