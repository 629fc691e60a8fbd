#!/usr/bin/env bash
# The CUDA benchmark rows of issues #12 and #13, on the GPU machine, from the unpacked archive of
# scripts/cuda_tests.sh (KILN_DIR, default /tmp/k/cuda) and this repository (its bench/ and
# scripts/): Kiln beside torch on the same GPU in one run (bench/compare.py --device cuda,
# alternating rounds), then `kiln bench` for every zoo model in the configurations compare.py
# leaves out. Everything is written under KILN_BENCH_WORK (default /tmp/kiln-bench) and packed
# into one archive, $OUT/bench.tar.xz (the device tool brings back only a few files per call).
#
#   KILN_COMPARE="bf16:1:resnet50,vit_b_16,bert_base f32:32:resnet50,bert_base"
#       (dtype:batch:models ...), KILN_COMPARE_SYSTEMS, KILN_COMPARE_TIMEOUT (s per model),
#   KILN_BENCH_MODELS (zoo models for the kiln bench loop), KILN_BENCH_CONFIGS ("f32:1 bf16:32").
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN_DIR="${KILN_DIR:-/tmp/k/cuda}"
DEST="${OUT:-/tmp/kiln-out}"
OUT="${KILN_BENCH_WORK:-/tmp/kiln-bench}"
mkdir -p "$OUT" "$DEST"
export LD_LIBRARY_PATH="$KILN_DIR:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SYSTEMS="${KILN_COMPARE_SYSTEMS:-kiln-compiled,kiln-compiled-reduce-overhead,torch-eager,torch-compile-reduce-overhead}"
for spec in ${KILN_COMPARE:-bf16:1:resnet50,vit_b_16,bert_base}; do
  IFS=: read -r dt batch models <<< "$spec"
  # One compare.py run (and folder) per model, KILN_COMPARE_TIMEOUT each: a model whose peers
  # compile slowly loses its own row only, not the rows after it in the spec (twelfth session:
  # torch.compile's compile of vit_b_16 took the whole spec's time and resnet50's table too).
  for model in ${models//,/ }; do
    tag="$dt-b$batch-$model"
    t0=$SECONDS
    timeout "${KILN_COMPARE_TIMEOUT:-200}" python3 "$REPO/bench/compare.py" --device cuda \
      --kiln "$KILN_DIR/kiln" --models "$model" --systems "$SYSTEMS" --dtype "$dt" --batch "$batch" \
      --iters "${KILN_COMPARE_ITERS:-100}" --rounds "${KILN_COMPARE_ROUNDS:-2}" --threads 2 \
      --compile-budget 120 --quiet --out "$OUT/compare-$tag" > "$OUT/compare-$tag.log" 2>&1
    echo "compare $dt batch $batch $model: exit $? ($((SECONDS - t0)) s)"
  done
done
for m in ${KILN_BENCH_MODELS:-}; do
  for cfg in ${KILN_BENCH_CONFIGS:-f32:1 bf16:1 f32:32 bf16:32}; do
    IFS=: read -r dt batch <<< "$cfg"
    for mode in default reduce-overhead; do
      "$KILN_DIR/kiln" bench "$m" --device cuda --backend compiled --mode "$mode" --dtype "$dt" \
        --batch "$batch" --iters "${KILN_BENCH_ITERS:-300}" --json \
        > "$OUT/bench_${m}_${dt}_b${batch}_${mode}.json" 2> "$OUT/bench_${m}_${dt}_b${batch}_${mode}.log" \
        || echo "bench $m $dt b$batch $mode: exit $?"
    done
  done
done
tar -C "$OUT" -cJf "$DEST/bench.tar.xz" . && echo "archive: $DEST/bench.tar.xz"
