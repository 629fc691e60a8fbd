#!/usr/bin/env bash
# Kiln's main job on a built-in model: build it, run it, report latency.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
"$ROOT/scripts/build.sh"
BUILD="${KILN_BUILD_DIR:-$ROOT/build}"
MODEL="${1:-resnet18}"
shift || true
"$BUILD/kiln" run "$MODEL" --iters 20 "$@"
