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
