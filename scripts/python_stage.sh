#!/usr/bin/env bash
# Stages what a machine without Debian's libraries needs to build and test the Python extension
# (the GPU machine: Python 3.12, torch 2.11, nanobind, g++, cmake; no oneDNN, fmt, protobuf).
#
#   scripts/python_stage.sh          # build/ (via scripts/build.sh), stage into .carry/python/
#
# Staged (ignored by git): .carry/python/lib/ = libkiln_python.so (bridge.cc; symbols
# and debug info stripped) and every shared library it loads that is not the C/C++ runtime
# (oneDNN, fmt, libgomp, protobuf, onnx_proto, OpenCL, zlib). There, only python/src/module.cc is compiled, against that library, with the
# machine's own Python and nanobind (Note [The bridge] in python/src/bridge.h); docs/python.md,
# "Building elsewhere", has the commands (also printed at the end).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
STAGE="$ROOT/.carry/python"

if [[ "$BUILD_DIR" == "$ROOT/build" ]]; then
  "$ROOT/scripts/build.sh"
fi
ninja -C "$BUILD_DIR" -j"${JOBS:-2}" kiln_python

LIB="$BUILD_DIR/python/kiln/libkiln_python.so"
[[ -f "$LIB" ]] || { echo "python_stage.sh: $LIB was not built" >&2; exit 1; }

rm -rf "$STAGE"
mkdir -p "$STAGE/lib"
strip --strip-all -o "$STAGE/lib/libkiln_python.so" "$LIB"
is_base_lib() {
  case "$1" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|linux-vdso*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
for bin in "$LIB"; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
  name="$(basename "$lib")"
  if is_base_lib "$name"; then continue; fi
  case "$name" in libcuda.so*) echo "python_stage.sh: $name must not be linked" >&2; exit 1 ;; esac
  case "$name" in
    libkiln_*) strip --strip-all -o "$STAGE/lib/$name" "$lib" ;;  # Kiln's layer libraries
    *) cp -L "$lib" "$STAGE/lib/$name" ;;
  esac
done

# pytest and its dependencies as wheels (pure Python), in case the GPU machine lacks pytest: it
# cannot reach a package index.
"${KILN_PYTHON:-${KILN_CACHE_DIR:-$HOME/.cache/kiln}/venv/bin/python}" -m pip download -q \
  --only-binary=:all: --python-version 3.12 --no-deps -d "$STAGE/wheels" \
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4

size_kib=$(du -sk "$STAGE" | cut -f1)
echo "staged $STAGE ($((size_kib / 1024)) MiB):"
ls -l "$STAGE/lib" | tail -n +2
if (( size_kib > 60 * 1024 )); then
  echo "python_stage.sh: warning: over 60 MiB; a device call carries at most 64 MiB" >&2
fi

cat <<'TXT'

On the GPU machine, from the repository root (carry [".carry/python"]); without pytest there,
first: python3 -m pip install --no-index --find-links .carry/python/wheels pytest
  cmake -S python -B /tmp/kiln-py -DKILN_PREBUILT=$PWD/.carry/python/lib \
        -DPython_EXECUTABLE=$(command -v python3) -DCMAKE_BUILD_TYPE=Release \
    && cmake --build /tmp/kiln-py -j 16 \
    && PYTHONPATH=/tmp/kiln-py/pkg LD_LIBRARY_PATH=/tmp/kiln-py/pkg/kiln python3 -m pytest -v -p no:cacheprovider tests/python/test_cuda.py
(CUDA graphs use the interpreter backend, so no C++ code generation is needed there; the CPU
suites need SLEEF and g++ for the CPU compiler's generated kernels and run on this machine.)
TXT
