#!/usr/bin/env bash
# Builds Kiln and runs every test (unit, op harness, IR text, end-to-end; CUDA tests run only
# where a GPU exists and are reported as not run elsewhere). Without arguments (CI's run) it then
# runs scripts/fuzz.sh: a clang ASan + UBSan build that runs the sanitized test subset and the
# fuzz corpus replays and fuzzes each harness briefly; KILN_TEST_SANITIZERS=0 skips it
# (docs/testing.md).
# Arguments go to CTest (`scripts/test.sh -L unit`) and skip the sanitizer steps.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# The venv first: the build makes the Python extension against it (python/CMakeLists.txt).
"$ROOT/scripts/setup_python.sh"
"$ROOT/scripts/build.sh"
BUILD="${KILN_BUILD_DIR:-$ROOT/build}"
export KILN_PYTHON="${KILN_CACHE_DIR:-$HOME/.cache/kiln}/venv/bin/python"
status=0
(cd "$BUILD" && ctest --output-on-failure -j"${KILN_JOBS:-2}" --timeout 900 "$@") || status=1
if [[ $# -eq 0 && "${KILN_TEST_SANITIZERS:-1}" != 0 ]]; then
  # The clang ASan + UBSan build: the sanitized test subset, the corpus replays, each fuzzer
  # for KILN_FUZZ_SECONDS (docs/testing.md, "What CI runs").
  t0=$SECONDS
  "$ROOT/scripts/fuzz.sh" "${KILN_FUZZ_SECONDS:-20}" || status=1
  echo "[test] sanitized tests and fuzzers: $((SECONDS - t0)) s"
fi
exit $status
