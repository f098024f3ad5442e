#!/usr/bin/env bash
# Fetches the UCX pinned in requirements/ucx-modern.txt (the libucx-cu12
# wheel from the Python package registry, checked against its sha256) and
# unpacks its libraries and headers to a fixed prefix, for
# `cmake -DKVCR_UCX_ROOT=<prefix>` (docs/ARCHITECTURE.md, "Peer failures over
# TCP": Debian 12's UCX 1.13.1 aborts a process whose TCP connection to a peer
# fails during connection set-up; later ones do not).
#
#   scripts/ucx-modern.sh              # prints the prefix on its last line
#   KVCR_UCX_MODERN_PREFIX=/opt/ucx scripts/ucx-modern.sh
#
# The prefix (default /var/cache/kvcr/ucx-<version>) holds include/, lib/
# (libucp, libuct, libucs, libucm, libucs_signal; lib/pkgconfig with its
# prefix rewritten; lib/ucx, the transport modules UCX loads from beside
# libucs, CMA only: TCP and the shared-memory transports sysv, posix and self
# are inside libuct) and bin/ucx_info. The wheel's CUDA modules are left out:
# without a GPU driver they only fail to load (a debug-level line), and with
# one they would bring CUDA's memory hooks into a host-memory cache. Nothing
# is installed into any Python. Idempotent: a complete prefix holding the
# pinned wheel's hash is left alone and nothing is downloaded; the wheel is
# kept in <prefix>.wheel, so a rerun after a failed unpack downloads nothing
# either. x86_64 only (the pin is that wheel's hash).
set -euo pipefail
cd "$(dirname "$0")/.."

REQS=requirements/ucx-modern.txt
version=$(sed -n 's/^libucx-cu12==\([0-9.]*\).*/\1/p' "$REQS")
sha=$(sed -n 's/.*--hash=sha256:\([0-9a-f]*\).*/\1/p' "$REQS")
if [ -z "$version" ] || [ -z "$sha" ]; then
  echo "ucx-modern: $REQS names no pinned libucx-cu12 with a sha256" >&2
  exit 1
fi
prefix=${KVCR_UCX_MODERN_PREFIX:-/var/cache/kvcr/ucx-$version}
stamp="$prefix/.kvcr-ucx-wheel-sha256"

if [ "$(cat "$stamp" 2>/dev/null)" = "$sha" ]; then
  echo "ucx-modern: UCX $version already at $prefix"
  echo "$prefix"
  exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "ucx-modern: the pinned wheel is x86_64's; this host is $(uname -m)" >&2
  exit 1
fi

mkdir -p "$(dirname "$prefix")"
# Two runs at once (two build scripts) would unpack over each other.
exec 9>"$prefix.lock"
flock 9
if [ "$(cat "$stamp" 2>/dev/null)" = "$sha" ]; then
  echo "ucx-modern: UCX $version already at $prefix"
  echo "$prefix"
  exit 0
fi

wheels="$prefix.wheel"
mkdir -p "$wheels"
# pip checks the hash of a wheel already in $wheels and downloads nothing.
python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
  --disable-pip-version-check -d "$wheels" -r "$REQS"
wheel=$(ls "$wheels"/libucx_cu12-"$version"-*.whl)
echo "$sha  $wheel" | sha256sum --check --quiet

work=$(mktemp -d "$prefix.unpack.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 - "$wheel" "$work" <<'EOF'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
keep = ("libucx/include/", "libucx/lib/lib", "libucx/lib/pkgconfig/",
        "libucx/lib/ucx/libuct_cma.so", "libucx/bin/ucx_info")
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith(keep) or name.endswith((".a", ".la")):
            continue
        path = z.extract(info, out)
        if name.startswith(("libucx/lib/", "libucx/bin/")) and not name.endswith(".pc"):
            os.chmod(path, 0o755)
EOF
src="$work/libucx"
# The .pc files name the wheel's build directory as their prefix.
sed -i "s|^prefix = .*|prefix = $prefix|" "$src"/lib/pkgconfig/*.pc
for lib in libucp libuct libucs libucm libucs_signal; do
  test -f "$src/lib/$lib.so.0" || { echo "ucx-modern: the wheel has no $lib.so.0" >&2; exit 1; }
done
test -f "$src/include/ucp/api/ucp.h" || { echo "ucx-modern: the wheel has no headers" >&2; exit 1; }
echo "$sha" > "$src/.kvcr-ucx-wheel-sha256"
rm -rf "$prefix"
mv "$src" "$prefix"
echo "ucx-modern: UCX $version unpacked at $prefix"
echo "$prefix"
