#!/usr/bin/env bash
# The clang build (docs/testing.md): build-fuzz/, configured with clang++-14 -DKILN_FUZZ=ON, which
# builds with ASan + UBSan (every finding fatal) and coverage instrumentation. It builds the
# libFuzzer harnesses of tests/fuzz/ and kiln_sanitize_tests, then runs the sanitized test
# subset (label `sanitize`), the corpus replays (`fuzz`) and each fuzzer for a while from its
# seeds (`fuzzrun`, one after another):
#   scripts/fuzz.sh [SECONDS]     each fuzzer for SECONDS (default 20), from libFuzzer seed 1
#   scripts/fuzz.sh --random-seed [SECONDS]   the same from a random seed (exploratory runs)
#   scripts/fuzz.sh --build-only  only configure and build (binaries: build-fuzz/tests/fuzz/)
# Only the layers these link are built: core, support, runtime, ops, ir, passes, lower, onnx.
# A finding fails the run and leaves the input in build-fuzz/fuzz/<name>/crash-* (replay it:
# build-fuzz/tests/fuzz/kiln_fuzz_<name> FILE).
# Environment: KILN_FUZZ_BUILD_DIR, KILN_JOBS (default 2), KILN_CLANG (default clang++-14).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_EACH=20
BUILD_ONLY=0
SEED=1  # fixed: CI's runs are reproducible (tests/fuzz/CMakeLists.txt, KILN_FUZZ_SEED)
for arg in "$@"; do
  case "$arg" in
    --build-only) BUILD_ONLY=1 ;;
    --random-seed) SEED=0 ;;
    *) SECONDS_EACH="$arg" ;;
  esac
done
CXX="${KILN_CLANG:-clang++-14}"
CC="${CXX/clang++/clang}"
command -v "$CXX" >/dev/null || { echo "[fuzz] $CXX not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }
BUILD="${KILN_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${KILN_JOBS:-2}"
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_CUDA_HOST_COMPILER=g++ \
        -DKILN_FUZZ=ON -DKILN_PYTHON=OFF >/dev/null
fi
cmake -B "$BUILD" -DKILN_FUZZ_SECONDS="$SECONDS_EACH" -DKILN_FUZZ_SEED="$SEED" >/dev/null
names=(ir onnx npy safetensors package launch_record)
targets=()
for n in "${names[@]}"; do targets+=("kiln_fuzz_$n" "kiln_fuzz_replay_$n"); done
targets+=(kiln_sanitize_tests)
start=$(date +%s)
mkdir -p "$BUILD"
if ! ninja -C "$BUILD" -j"$JOBS" "${targets[@]}" >"$BUILD/fuzz_build.log" 2>&1; then
  grep -v "^\[" "$BUILD/fuzz_build.log" | tail -60 >&2
  echo "[fuzz] build failed (full log: $BUILD/fuzz_build.log)" >&2
  exit 1
fi
echo "[fuzz] build: $(( $(date +%s) - start ))s"
((BUILD_ONLY)) && exit 0
cd "$BUILD"
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizer/lsan.supp:print_suppressions=0"
export OMP_NUM_THREADS=1  # clang's libomp and oneDNN's libgomp share the process; keep one thread
export KILN_PYTHON="${KILN_CACHE_DIR:-$HOME/.cache/kiln}/venv/bin/python"
status=0
start=$(date +%s)
ctest --output-on-failure -j"$JOBS" --timeout 1800 -L '^(sanitize|fuzz)$' || status=1
echo "[fuzz] sanitized tests and replays: $(( $(date +%s) - start ))s"
# The fuzzers one at a time: each is one process, and CI's two cores run the rest too.
start=$(date +%s)
ctest --output-on-failure -L '^fuzzrun$' -j1 || status=1
echo "[fuzz] fuzzing: $(( $(date +%s) - start ))s"
exit $status
