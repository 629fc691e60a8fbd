#!/usr/bin/env bash
# Installs Kiln from the build tree into a temporary prefix and builds examples/cpp_compile
# against it twice — as its own CMake project (find_package(Kiln)) and with pkg-config alone —
# then runs both programs: a custom module compiled with kiln::compile must match eager.
#   installed_example.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD="$1"
SRC="$2"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kiln-example-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"

cmake --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; echo "installed_example: cmake --install failed" >&2; exit 1; }
for f in include/kiln/kiln.h include/kiln/runtime.h lib/cmake/Kiln/KilnConfig.cmake \
         lib/cmake/KilnRuntime/KilnRuntimeConfig.cmake include/kiln/kiln_runtime.h \
         lib/pkgconfig/kiln.pc lib/pkgconfig/kiln-runtime.pc lib/libkiln_runtime.so bin/kiln; do
  [[ -e "$PREFIX/$f" ]] || { echo "installed_example: $f was not installed" >&2; exit 1; }
done

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$SRC/examples/cpp_compile" -B "$WORK/build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; echo "installed_example: configuring the example failed" >&2; exit 1; }
cmake --build "$WORK/build" >"$WORK/build.log" 2>&1 ||
  { cat "$WORK/build.log"; echo "installed_example: building the example failed" >&2; exit 1; }
"$WORK/build/kiln_example"

export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
# shellcheck disable=SC2046
${CCACHE:-$(command -v ccache || true)} c++ -O1 -o "$WORK/kiln_example_pc" "$SRC/examples/cpp_compile/main.cc" \
    $(pkg-config --cflags --libs kiln)
"$WORK/kiln_example_pc"

# The C example (examples/c_run) against the installed runtime alone (pkg-config kiln-runtime):
# the installed kiln compiles a package, and a C program that links only libkiln_runtime loads
# (its pkg-config flags minus -std=c++20, which is for the C++ headers)
# it and runs it in a bare environment (no compiler or Python on PATH, no cache directory).
"$PREFIX/bin/kiln" compile mlp -o "$WORK/mlp.kiln" >"$WORK/compile.log" 2>&1 ||
  { cat "$WORK/compile.log"; echo "installed_example: kiln compile failed" >&2; exit 1; }
# shellcheck disable=SC2046
cc -O1 -o "$WORK/kiln_c_run" "$SRC/examples/c_run/main.c" \
    $(pkg-config --cflags --libs kiln-runtime | sed 's/-std=c++20//') -lm
mkdir -p "$WORK/home"
env -i PATH="$WORK/nothing" HOME="$WORK/home" "$WORK/kiln_c_run" "$WORK/mlp.kiln" |
  grep -q "^output 0 " || { echo "installed_example: kiln_c_run printed no output" >&2; exit 1; }

# The same C example as its own CMake project with find_package(KilnRuntime): the runtime's
# libraries and include directory only (no fmt, OpenMP or Kiln::kiln needed), same bare run.
cmake -S "$SRC/examples/c_run" -B "$WORK/build-c" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" \
      >"$WORK/configure-c.log" 2>&1 ||
  { cat "$WORK/configure-c.log"; echo "installed_example: configuring examples/c_run failed" >&2; exit 1; }
cmake --build "$WORK/build-c" >"$WORK/build-c.log" 2>&1 ||
  { cat "$WORK/build-c.log"; echo "installed_example: building examples/c_run failed" >&2; exit 1; }
env -i PATH="$WORK/nothing" HOME="$WORK/home" "$WORK/build-c/kiln_c_run" "$WORK/mlp.kiln" |
  grep -q "^output 0 " || { echo "installed_example: the CMake-built kiln_c_run printed no output" >&2; exit 1; }
