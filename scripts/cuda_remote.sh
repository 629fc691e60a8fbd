#!/usr/bin/env bash
# Runs on the GPU machine, from the unpacked archive of scripts/cuda_tests.sh (staged there as
# run.sh): the CUDA suite, the op harness's CUDA cases, and `kiln bench --device cuda` on a few
# zoo models in default and reduce-overhead modes. Everything it prints goes into logs under
# $OUT, packed as one archive (the device tool brings back only a few files per call).
#
#   cd /tmp/k/cuda && ./run.sh [MODEL...]       # models default: mlp resnet18 bert_base
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/kiln-out}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
cd "$HERE"
export LD_LIBRARY_PATH="$HERE:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(mlp resnet18 bert_base)

summary="$LOGS/summary.txt"
: > "$summary"
step() {  # step NAME CMD...: runs CMD with its output in NAME.log, records the exit status
  local name="$1"; shift
  local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc ($((SECONDS - t0)) s)" | tee -a "$summary"
}
step device ./kiln device
# KILN_CUDA_TEST_FILTER: a gtest filter for the CUDA suite (default: all of it).
step cuda_tests ./kiln_cuda_tests --gtest_filter="${KILN_CUDA_TEST_FILTER:-*}"
step op_tests ./kiln_op_tests --gtest_filter='*cuda*'
for m in "${models[@]}"; do
  for mode in default reduce-overhead; do
    t0=$SECONDS
    ./kiln bench "$m" --device cuda --backend compiled --mode "$mode" --iters 200 --json \
      > "$LOGS/bench_${m}_${mode}.json" 2> "$LOGS/bench_${m}_${mode}.log"
    echo "bench_${m}_${mode}: exit $? ($((SECONDS - t0)) s)" | tee -a "$summary"
  done
done
# The failures, in one place.
grep -hE "^\[  FAILED  \]|Failure|fatal signal|error:" "$LOGS"/*.log | sort | uniq -c | sort -rn \
  | head -200 > "$LOGS/failures.txt"
cat "$LOGS/failures.txt"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$LOGS"
