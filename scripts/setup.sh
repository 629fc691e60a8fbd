#!/usr/bin/env bash
# Installs what Kiln needs to build on a fresh Debian 12 machine: build tools and libraries from
# Debian. (The Python venv that the tests and the peer benchmarks use is scripts/setup_python.sh;
# building and running Kiln need none of it.) Idempotent and quiet when everything is there.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libgtest-dev libbenchmark-dev
  libdnnl-dev libsleef-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libonnx-dev libprotobuf-dev protobuf-compiler
  libonnx-testdata
  libssl-dev
  clang-14 libclang-rt-14-dev libomp-14-dev  # the fuzz build (scripts/fuzz.sh, docs/testing.md)
  python3-venv python3-dev
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "[setup] error: the CUDA toolkit (nvcc) is required at build time; expected /usr/local/cuda" >&2
  exit 1
fi

