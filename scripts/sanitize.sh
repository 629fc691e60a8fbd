#!/usr/bin/env bash
# Builds Kiln with a sanitizer in its own build folder and runs the sanitized tests
# (docs/testing.md):
#   scripts/sanitize.sh [address|thread] [extra ctest args...]
#   address (default): AddressSanitizer + UndefinedBehaviorSanitizer (every finding fatal), in
#     build-asan/; thread: ThreadSanitizer, in build-tsan/, where it builds and runs
#     kiln_sanitize_thread_tests instead (label `sanitize_threads`: the tests where Kiln runs
#     threads of its own; the others run no thread that TSan could check).
# By default it builds and runs kiln_sanitize_tests (the unit, IR, op-harness and ONNX importer
# and hostile-file tests that need only the layers below the compiler: CTest label `sanitize`)
# and the fuzz corpus replays (label `fuzz`). KILN_SANITIZE_ALL=1 builds every layer and runs
# the labels unit, ops, ir, fuzz and OnnxImport.*/OnnxErrors.* instead (much slower to build).
# A sanitizer report makes the test's process exit non-zero, so the test fails.
# Environment: KILN_SANITIZE_BUILD_DIR (build folder), KILN_JOBS (default 2), KILN_SANITIZE_CXX
# (the C++ compiler: g++ by default; clang++-14 compiles the instrumented code about three times
# faster, and its tree is then build-asan-clang/ or build-tsan-clang/; clang 14's shared TSan
# runtime crashes before main next to libgomp, docs/testing.md).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODE="${1:-address}"
[[ $# -gt 0 ]] && shift
case "$MODE" in
  address) DIR=build-asan ;;
  thread) DIR=build-tsan ;;
  *) echo "usage: scripts/sanitize.sh [address|thread] [ctest args...]" >&2; exit 2 ;;
esac
"$ROOT/scripts/setup.sh"
CXX="${KILN_SANITIZE_CXX:-g++}"
compiler_args=()
if [[ "$CXX" == *clang* ]]; then
  command -v "$CXX" >/dev/null || { echo "[sanitize] $CXX not found (scripts/setup.sh installs clang-14)" >&2; exit 1; }
  DIR="$DIR-clang"
  compiler_args=(-DCMAKE_C_COMPILER="${CXX/clang++/clang}" -DCMAKE_CXX_COMPILER="$CXX"
                 -DCMAKE_CUDA_HOST_COMPILER=g++)
fi
BUILD="${KILN_SANITIZE_BUILD_DIR:-$ROOT/$DIR}"
JOBS="${KILN_JOBS:-2}"
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${compiler_args[@]}" \
        -DKILN_SANITIZE="$MODE" -DKILN_PYTHON=OFF >/dev/null
fi
start=$(date +%s)
replays=(kiln_fuzz_replay_ir kiln_fuzz_replay_onnx kiln_fuzz_replay_npy kiln_fuzz_replay_safetensors)
if [[ "${KILN_SANITIZE_ALL:-0}" == 1 ]]; then
  targets=(kiln_unit_tests kiln_op_tests kiln_ir_tests kiln_onnx_tests kiln_cli "${replays[@]}")
elif [[ "$MODE" == thread ]]; then
  targets=(kiln_sanitize_thread_tests)
else
  targets=(kiln_sanitize_tests "${replays[@]}")
fi
mkdir -p "$BUILD"
if ! ninja -C "$BUILD" -j"$JOBS" "${targets[@]}" >"$BUILD/sanitize_build.log" 2>&1; then
  grep -v "^\[" "$BUILD/sanitize_build.log" | tail -60 >&2
  echo "[sanitize] $MODE build failed (full log: $BUILD/sanitize_build.log)" >&2
  exit 1
fi
echo "[sanitize] $MODE build: $(( $(date +%s) - start ))s"

# Sanitizer settings. Leak checking is on for ASan: a test that leaks fails.
SUPP="$ROOT/tests/sanitizer"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
# libgomp is not built with TSan, so its barriers are invisible to it and every OpenMP kernel
# would look like a race; one OpenMP thread keeps the report to Kiln's own threads.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
[[ "$MODE" == thread ]] && export OMP_NUM_THREADS=1
export KILN_PYTHON="${KILN_CACHE_DIR:-$HOME/.cache/kiln}/venv/bin/python"

cd "$BUILD"
start=$(date +%s)
status=0
if [[ "${KILN_SANITIZE_ALL:-0}" == 1 ]]; then
  ctest --output-on-failure -j"$JOBS" --timeout 1800 -L '^(unit|ops|ir|fuzz)$' "$@" || status=1
  ctest --output-on-failure -j"$JOBS" --timeout 900 -R '^Onnx(Import|Errors)\.' "$@" || status=1
elif [[ "$MODE" == thread ]]; then
  ctest --output-on-failure -j"$JOBS" --timeout 1800 -L '^sanitize_threads$' "$@" || status=1
else
  ctest --output-on-failure -j"$JOBS" --timeout 1800 -L '^(sanitize|fuzz)$' "$@" || status=1
fi
echo "[sanitize] $MODE tests: $(( $(date +%s) - start ))s"
exit $status
