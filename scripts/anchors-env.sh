#!/usr/bin/env bash
# Makes the environment `kvcr-bench anchors` runs the anchors in: a virtual
# environment holding the reference implementation (`kvcr` 0.1.1), NIXL and
# Mooncake's transfer engine, exactly as pinned in requirements/anchors.txt.
#
#   scripts/anchors-env.sh            # prints the venv's python at the end
#
# Where: KVCR_ANCHORS_VENV (default /var/cache/kvcr/anchors-venv), outside the
# work tree so that a fresh clone on the same machine reuses it. Idempotent:
# the venv carries a stamp of the lock file and of the interpreter, and a
# matching stamp installs nothing. This tree's kvcr is never installed here:
# the reference has the same import name and owns it in this venv.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KVCR_ANCHORS_VENV:-/var/cache/kvcr/anchors-venv}
PY=/usr/bin/python3
LOCK=requirements/anchors.txt

source scripts/debian-packages.sh
ensure_debian_packages anchors-env python3-venv

want=$(cat "$LOCK" <(echo "$($PY -V)") | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.kvcr-anchors" ] && [ "$(cat "$VENV/.kvcr-anchors")" = "$want" ]; then
  echo "anchors-env: packages up to date in $VENV" >&2
else
  # Made anew when the lock changes, so that a package dropped from it does
  # not linger.
  echo "anchors-env: making $VENV" >&2
  start=$SECONDS
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  $PY -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$LOCK"
  # The anchors must import, or the stamp would hide a broken venv.
  (cd / && "$VENV/bin/python" -c "import kvcr, nixl, mooncake.engine")
  echo "$want" > "$VENV/.kvcr-anchors"
  echo "anchors-env: installed in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))" >&2
fi
echo "$VENV/bin/python"
