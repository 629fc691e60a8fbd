#!/usr/bin/env bash
# Configures (once) and builds Kiln incrementally in build/ with ninja -j2 and ccache.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
"$ROOT/scripts/setup.sh"
BUILD="${KILN_BUILD_DIR:-$ROOT/build}"
# Let ccache share results between clones in different folders (CI clones afresh).
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
ninja -C "$BUILD" -j"${KILN_JOBS:-2}" | grep -v "^\[" || true
test -x "$BUILD/kiln" || { echo "[build] failed" >&2; exit 1; }
