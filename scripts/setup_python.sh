#!/usr/bin/env bash
# The Python venv outside the clone (reused across clones and CI runs on the same machine):
# numpy, onnx, onnxruntime, torch, torchvision, transformers, nanobind, scikit-build-core, pytest
# (scripts/requirements.txt) for the tests that compare with ONNX Runtime and PyTorch, the peer
# benchmarks, and the Python extension (python/: built against this venv) with its pytest
# suites. Kiln's C++ itself needs none of it. Idempotent and quiet when the venv matches the requirements.
set -euo pipefail
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
