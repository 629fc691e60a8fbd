#!/usr/bin/env bash
# Runs on the GPU machine, from the unpacked archive of scripts/cuda_tests.sh (staged there as
# run.sh): the CUDA suite, the op harness's CUDA cases, and `kiln bench --device cuda` on a few
# zoo models in default and reduce-overhead modes. Everything it prints goes into logs under
# $OUT, packed as one archive (the device tool brings back only a few files per call).
#
#   cd /tmp/k/cuda && ./run.sh [MODEL...]       # models default: mlp resnet18 bert_base
#   KILN_REMOTE_PARALLEL=1 runs suite, ops and conformance at the same time (then the rest).
#   KILN_SUITE_SHARDS=N runs the CUDA suite in N processes (gtest shards).
#   KILN_REMOTE_STEPS=suite,ops,bench,conformance,models,sanitize,cpu (the default: all) picks steps, so
#   that a long run can be split over two device calls. KILN_STEP_TIMEOUT (s, default 900)
#   bounds each step, so that one hung step still leaves the others' logs.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/kiln-out}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
cd "$HERE"
export LD_LIBRARY_PATH="$HERE:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The CPU kernels compiled here link -lsleef: the staged libsleef.so (this machine has no
# libsleef-dev).
export LIBRARY_PATH="$HERE${LIBRARY_PATH:+:$LIBRARY_PATH}"
export KILN_C_RUN="${KILN_C_RUN:-$HERE/kiln_c_run}"  # the C example, for the package tests
export KILN_CLI="${KILN_CLI:-$HERE/kiln}"  # the CLI, for compiles in a separate process
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(mlp resnet18 bert_base)

summary="$LOGS/summary.txt"
: > "$summary"
step() {  # step NAME CMD...: runs CMD with its output in NAME.log, records the exit status
  local name="$1"; shift
  local t0=$SECONDS
  timeout "${KILN_STEP_TIMEOUT:-900}" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc ($((SECONDS - t0)) s)" | tee -a "$summary"
}
steps=",${KILN_REMOTE_STEPS:-suite,ops,bench,conformance,models,sanitize,cpu},"
want() { [[ "$steps" == *",$1,"* ]]; }
step device ./kiln device
# sharded NAME SHARDS CMD...: CMD in SHARDS processes at once (gtest sharding), each logging to
# NAME_<i>.log; records the exit status (0 when every shard passed) and the shards' verdicts.
sharded() {
  local name="$1" shards="$2" t0=$SECONDS rc=0 pids=()
  shift 2
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${KILN_STEP_TIMEOUT:-900}" "$@" \
      > "$LOGS/${name}_$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  echo "$name ($shards shards): exit $rc ($((SECONDS - t0)) s)" | tee -a "$summary"
  grep -h "^\[  PASSED  \]\|^\[  FAILED  \] [0-9]\|^\[  SKIPPED \]" "$LOGS/${name}"_*.log | tee -a "$summary"
  return 0
}
# KILN_CUDA_TEST_FILTER: a gtest filter for the CUDA suite (default: all of it).
# KILN_SUITE_SHARDS=N (default 1) runs it in N processes at once: on a freshly started machine
# cuDNN's runtime-fusion JIT makes a few convolution tests take a minute each, and one process
# then runs past a device call's limit.
run_suite() {
  want suite || return 0
  local shards="${KILN_SUITE_SHARDS:-1}"
  if [[ "$shards" -le 1 ]]; then
    step cuda_tests ./kiln_cuda_tests --gtest_filter="${KILN_CUDA_TEST_FILTER:-*}"
  else
    sharded cuda_tests "$shards" ./kiln_cuda_tests --gtest_filter="${KILN_CUDA_TEST_FILTER:-*}"
  fi
  return 0
}
# The op harness's CUDA cases in KILN_OP_SHARDS processes at once (default 8: the GPU machine
# has 16 cores, and the eager cases compile one NVRTC program per signature).
run_ops() {
  want ops || return 0
  sharded op_tests "${KILN_OP_SHARDS:-8}" ./kiln_op_tests --gtest_filter='*cuda*'
}
# ONNX conformance on the device (eager and compiled) where the test data was carried along:
# KILN_ONNX_DATA=folder holding node/ simple/ pytorch-converted/ pytorch-operator/.
run_conformance() {
  want conformance && [[ -n "${KILN_ONNX_DATA:-}" ]] || return 0
  step conformance_eager ./kiln conformance --device cuda --data "$KILN_ONNX_DATA"
  step conformance_compiled ./kiln conformance --device cuda --backend compiled --data "$KILN_ONNX_DATA"
  tail -n 3 "$LOGS/conformance_eager.log" "$LOGS/conformance_compiled.log" | tee -a "$summary"
}
# KILN_REMOTE_PARALLEL=1: the three correctness steps at once (they share the GPU and the 16
# cores; none of them times anything), the timed steps after them, alone. Waits for exactly
# these three (`wait PID`), never for anything else the caller started.
if [[ "${KILN_REMOTE_PARALLEL:-0}" == 1 ]]; then
  run_suite & p1=$!
  run_ops & p2=$!
  run_conformance & p3=$!
  wait "$p1" "$p2" "$p3"
else
  run_suite
  run_ops
  run_conformance
fi
# The exported models (scripts/export_models.py, exported here with this machine's torch) compiled
# on CUDA against the CPU eager run and ONNX Runtime's outputs: KILN_REPO=the repository's root
# (its scripts/), KILN_ONNX_MODELS=names (default: all of export_models.MODELS).
if want models && [[ -n "${KILN_REPO:-}" ]]; then
  step onnx_models python3 "$KILN_REPO/scripts/cuda_onnx_models.py" --kiln ./kiln --out /tmp/kiln-models \
    --json "$LOGS/onnx_models.json" ${KILN_ONNX_MODELS:-}
  tail -n 12 "$LOGS/onnx_models.log" | tee -a "$summary"
fi
# compute-sanitizer over the compiled zoo (issue #12): memcheck and racecheck of `kiln run MODEL
# --device cuda` (compiled on the device, a few calls) for KILN_SANITIZE_MODELS (default: every
# zoo model). The tool reports "ERROR SUMMARY: 0 errors" / "RACECHECK SUMMARY: 0 hazards".
# KILN_SANITIZE_TOOLS (default "memcheck racecheck"), KILN_SANITIZE_ITERS (default 2: timed
# calls after one warm-up), KILN_SANITIZE_PARALLEL=1: one process per model and tool at once
# (racecheck of the large models takes minutes each; the GPU machine has 16 cores).
# KILN_SANITIZE_ARGS: more compute-sanitizer options, e.g. `--kernel-name kre=^(k[0-9]+_|kn_)`
# to check only Kiln's own kernels (loop kernels k<N>_..., direct kernels kn_...): racecheck
# instruments every shared-memory access, and cuBLASLt's and cuDNN's kernels make it take tens
# of minutes on vit_b_16 and bert_base.
sanitize_one() {  # MODEL TOOL
  # shellcheck disable=SC2086 # KILN_SANITIZE_ARGS: extra options (e.g. a kernel-name filter)
  step "sanitize_$2_$1" compute-sanitizer --tool "$2" --error-exitcode 3 ${KILN_SANITIZE_ARGS:-} \
    ./kiln run "$1" --device cuda --backend compiled --iters "${KILN_SANITIZE_ITERS:-2}" --warmup 1
}
if want sanitize && command -v compute-sanitizer >/dev/null; then
  san_pids=()
  for m in ${KILN_SANITIZE_MODELS:-mlp vfe branchy resnet18 resnet50 vit_b_16 bert_base}; do
    for tool in ${KILN_SANITIZE_TOOLS:-memcheck racecheck}; do
      if [[ "${KILN_SANITIZE_PARALLEL:-0}" == 1 ]]; then
        sanitize_one "$m" "$tool" & san_pids+=($!)
      else
        sanitize_one "$m" "$tool"
      fi
    done
  done
  for pid in "${san_pids[@]}"; do wait "$pid"; done
  for m in ${KILN_SANITIZE_MODELS:-mlp vfe branchy resnet18 resnet50 vit_b_16 bert_base}; do
    for tool in ${KILN_SANITIZE_TOOLS:-memcheck racecheck}; do
      grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/sanitize_${tool}_$m.log" | sed "s/^/  $m $tool: /" | tee -a "$summary"
    done
  done
fi
# CPU throughput of one compiled model at 1, 2 and 4 caller threads (issue #16), on this
# machine's idle cores.
if want cpu && [[ -x ./kiln_concurrent_bench ]]; then
  step concurrent_bench env OMP_NUM_THREADS=1 ./kiln_concurrent_bench --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true
fi
if want cpu && [[ -x ./kiln_capture_bench ]]; then
  step capture_bench env OMP_NUM_THREADS=1 ./kiln_capture_bench --benchmark_filter=CompiledZoo \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
fi
want bench || models=()
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
