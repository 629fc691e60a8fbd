#!/usr/bin/env bash
# Builds the CUDA test suite here and stages what a GPU machine needs to run it.
#
#   scripts/cuda_tests.sh            # build/ (via scripts/build.sh when present), stage, print
#   BUILD_DIR=build-x scripts/cuda_tests.sh
#
# This machine has no GPU: kiln_cuda_tests exits 77 here ("no CUDA device"), which CTest shows
# as skipped. The binaries link the static CUDA runtime and never libcuda, so they start on any
# machine; on a GPU machine they find the driver at run time. Staged into .carry/cuda/ (ignored
# by git): kiln_cuda_tests, kiln, and the shared libraries they load that are not part of the
# base system (oneDNN, SLEEF, fmt, libgomp, and oneDNN's libOpenCL), since the GPU machine
# (Ubuntu 24.04 + CUDA 13) does not have Debian's builds of them; never the CUDA toolkit's own
# libraries (NVRTC, cuBLASLt, cuDNN), which the GPU machine has. Binaries are stripped of debug
# info (--strip-debug; their symbols stay, so a crash backtrace names functions) so that the
# archive stays well under the 64 MiB a device call may carry.
# See docs/cuda.md for how the suite is run on the H200 and what it reported.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
JOBS="${JOBS:-2}"
STAGE="$ROOT/.carry/cuda"

# ---- build ----------------------------------------------------------------------------------
if [[ "$BUILD_DIR" == "$ROOT/build" && -x "$ROOT/scripts/build.sh" ]]; then
  "$ROOT/scripts/build.sh"
elif [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja
fi
ninja -C "$BUILD_DIR" -j"$JOBS" kiln_cuda_tests kiln_op_tests kiln_cli kiln_concurrent_bench kiln_capture_bench kiln_c_run

TESTS="$BUILD_DIR/tests/kiln_cuda_tests"
OPS="$BUILD_DIR/tests/kiln_op_tests"
CLI="$BUILD_DIR/kiln"
# CPU benchmarks of issue #16 (the GPU machine's 16 idle cores): throughput at 1/2/4 callers,
# the per-call cost of check_host_values.
CONC="$BUILD_DIR/bench/kiln_concurrent_bench"
CAPB="$BUILD_DIR/bench/kiln_capture_bench"
# The C example: CudaPackage.RunsInSeparateProcess... runs a package with it (KILN_C_RUN).
CRUN="$BUILD_DIR/tests/kiln_c_run"
for f in "$TESTS" "$OPS" "$CLI" "$CONC" "$CAPB" "$CRUN"; do
  [[ -x "$f" ]] || { echo "cuda_tests.sh: $f was not built" >&2; exit 1; }
done

# ---- stage ----------------------------------------------------------------------------------
rm -rf "$STAGE"
mkdir -p "$STAGE"
strip --strip-debug -o "$STAGE/kiln_cuda_tests" "$TESTS"
strip --strip-debug -o "$STAGE/kiln_op_tests" "$OPS"
strip --strip-debug -o "$STAGE/kiln" "$CLI"
strip --strip-debug -o "$STAGE/kiln_concurrent_bench" "$CONC"
strip --strip-debug -o "$STAGE/kiln_capture_bench" "$CAPB"
strip --strip-debug -o "$STAGE/kiln_c_run" "$CRUN"
cp "$ROOT/scripts/cuda_remote.sh" "$STAGE/run.sh"
cp "$ROOT/scripts/cuda_knob_ab.sh" "$STAGE/ab.sh"  # A/B of two knob settings on the GPU machine

# Every library the two binaries load (ldd lists indirect ones too), minus the C/C++ runtime
# and loader that every Linux machine has in a newer version.
is_base_lib() {
  case "$1" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|linux-vdso*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
# The CUDA toolkit's libraries are never shipped: they are hundreds of MB (libcublasLt alone is
# 540 MB, cuDNN's engines 250 MB) and the GPU machine has its own (CUDA 13 under
# /usr/local/cuda/lib64, cuDNN 9.14 as a system library), which must be the ones used: a cuDNN
# 9.19 front library next to 9.14 engine libraries would not load. Kiln opens NVRTC, cuBLASLt
# and cuDNN with dlopen (src/kernels/cuda/dynamic_library.h), so ldd does not list them today;
# this guards against a future link.
is_cuda_toolkit_lib() {
  case "$1" in
    libcublas*.so*|libcudnn*.so*|libnvrtc*.so*|libnvJitLink*.so*|libcudart.so*) return 0 ;;
  esac
  return 1
}
for bin in "$TESTS" "$OPS" "$CLI" "$CONC" "$CAPB" "$CRUN"; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
  name="$(basename "$lib")"
  if is_base_lib "$name" || is_cuda_toolkit_lib "$name"; then continue; fi
  case "$name" in libcuda.so*) echo "cuda_tests.sh: a binary links $name; it must not (reach the driver at run time)" >&2; exit 1 ;; esac
  # Kiln's own layer libraries lose their symbols and debug info too.
  case "$name" in libkiln_*) strip --strip-unneeded -o "$STAGE/$name" "$lib" ;; *) cp -L "$lib" "$STAGE/$name" ;; esac
done

# SLEEF for the CPU kernels the suite compiles there (a CUDA test compares with the CPU compiled
# run; generated units link -lsleef): no staged binary links it any more, and the GPU machine
# has no libsleef-dev. The runtime library and a linker name for it (run.sh puts the folder on
# LIBRARY_PATH as well as LD_LIBRARY_PATH).
sleef="$(g++ -print-file-name=libsleef.so)"
[[ -f "$sleef" ]] || { echo "cuda_tests.sh: libsleef.so not found (install libsleef-dev)" >&2; exit 1; }
cp -L "$sleef" "$STAGE/libsleef.so.3"
ln -sf libsleef.so.3 "$STAGE/libsleef.so"

# The device tool carries at most 64 MiB per call (tree included): the folder travels as one
# xz archive (.carry/cuda.tar.xz), unpacked there.
size_kib=$(du -sk "$STAGE" | cut -f1)
echo "staged $STAGE ($((size_kib / 1024)) MiB):"
ls -l "$STAGE" | tail -n +2
tar -C "$(dirname "$STAGE")" -cf - "$(basename "$STAGE")" | xz -T2 -6 > "$ROOT/.carry/cuda.tar.xz"
echo "archive $ROOT/.carry/cuda.tar.xz: $(( $(stat -c %s "$ROOT/.carry/cuda.tar.xz") / 1024 / 1024 )) MiB"

# Here: the suite must skip cleanly (exit 77) and `kiln device` must exit 0.
set +e
(cd "$STAGE" && LD_LIBRARY_PATH=. ./kiln device)
dev_rc=$?
(cd "$STAGE" && LD_LIBRARY_PATH=. ./kiln_cuda_tests >/dev/null)
suite_rc=$?
set -e
echo "here: kiln device exit $dev_rc; kiln_cuda_tests exit $suite_rc (77 = no CUDA device, skipped)"

cat <<'EOF'

Run on the GPU machine (device tool: run with carry [".carry/cuda.tar.xz"], from the repository
root). NVRTC, cuBLASLt and cuDNN are the machine's own (/usr/local/cuda/lib64, the system cuDNN):

  mkdir -p /tmp/k && tar -C /tmp/k -xJf .carry/cuda.tar.xz && /tmp/k/cuda/run.sh

run.sh (scripts/cuda_remote.sh) runs the suite, the op harness's CUDA cases and a few CUDA
benchmarks, and leaves their logs as one archive, $OUT/logs.tar.xz.

EOF
