#!/usr/bin/env bash
# Builds Kiln and runs every test (unit, op harness, IR text, end-to-end; CUDA tests run only
# where a GPU exists and are reported as not run elsewhere).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# The venv first: the build makes the Python extension against it (python/CMakeLists.txt).
"$ROOT/scripts/setup_python.sh"
"$ROOT/scripts/build.sh"
BUILD="${KILN_BUILD_DIR:-$ROOT/build}"
export KILN_PYTHON="${KILN_CACHE_DIR:-$HOME/.cache/kiln}/venv/bin/python"
cd "$BUILD"
ctest --output-on-failure -j"${KILN_JOBS:-2}" --timeout 900 "$@"
