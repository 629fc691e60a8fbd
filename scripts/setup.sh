#!/usr/bin/env bash
# Installs what Kiln needs on a fresh Debian 12 machine: build tools and libraries from Debian,
# and a Python venv outside the clone (reused across clones and CI runs on the same machine).
# Idempotent and quiet when everything is already there.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libgtest-dev libbenchmark-dev
  libdnnl-dev libsleef-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libonnx-dev libprotobuf-dev protobuf-compiler
  libonnx-testdata
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

# Python venv: numpy is used by tests that cross-check .npy files with NumPy itself.
KILN_CACHE_DIR="${KILN_CACHE_DIR:-$HOME/.cache/kiln}"
VENV="$KILN_CACHE_DIR/venv"
REQS="$(cd "$(dirname "$0")" && pwd)/requirements.txt"
STAMP="$VENV/.kiln-requirements"
if [[ ! -x "$VENV/bin/python" ]] || ! cmp -s "$REQS" "$STAMP"; then
  echo "[setup] creating Python venv in $VENV"
  PY=python3
  "$PY" -m venv "$VENV" 2>/dev/null || { rm -rf "$VENV"; "$PY" -m venv "$VENV"; }
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -r "$REQS"
  cp "$REQS" "$STAMP"
fi
