#!/usr/bin/env bash
# Runs on the GPU machine, from the unpacked archive of scripts/cuda_tests.sh (staged there as
# ab.sh): `kiln bench` of each model under two knob settings, alternating A and B in every
# round, so that both see the same machine state (these machines drift between runs). One line
# per run in $OUT/ab.txt, and a median per model and setting at the end.
#
#   cd /tmp/k/cuda && ./ab.sh "pdl=off" "pdl=on" bert_base:bf16 vit_b_16:bf16 mlp:f32
#   AB_MODE=reduce-overhead (default) | default | max-autotune, AB_ROUNDS=2, AB_ITERS=1000
#
# Each model is NAME:DTYPE (DTYPE f32, bf16 or f16). The settings are KILN_KNOBS values (an
# empty string is the default configuration).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/kiln-out}"
mkdir -p "$OUT"
cd "$HERE"
export LD_LIBRARY_PATH="$HERE:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$HERE${LIBRARY_PATH:+:$LIBRARY_PATH}"
[[ $# -ge 3 ]] || { echo "usage: ab.sh KNOBS_A KNOBS_B MODEL:DTYPE..." >&2; exit 2; }
a="$1" b="$2"
shift 2
ab="$OUT/ab.txt"
: > "$ab"
mode="${AB_MODE:-reduce-overhead}"
for spec in "$@"; do
  model="${spec%%:*}" dtype="${spec#*:}"
  for ((round = 1; round <= ${AB_ROUNDS:-2}; ++round)); do
    for which in A B; do
      knobs="$a"
      [[ "$which" == B ]] && knobs="$b"
      f="$OUT/ab_${model}_${dtype}_${which}_${round}.json"
      KILN_KNOBS="$knobs" timeout 120 ./kiln bench "$model" --device cuda --backend compiled \
        --mode "$mode" --dtype "$dtype" --iters "${AB_ITERS:-1000}" --warmup 20 --json \
        > "$f" 2> "$f.err"
      python3 - "$f" "$model $dtype $mode $which [$knobs] round $round" >> "$ab" 2>/dev/null <<'PY' ||
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: p50 {d['p50_ms']:.4f} p99 {d['p99_ms']:.4f} launches {d.get('launches_per_call')}")
PY
        echo "$model $dtype $mode $which [$knobs] round $round: failed: $(tail -c 300 "$f.err")" >> "$ab"
    done
  done
done
# Medians per model and setting.
python3 - "$ab" <<'PY' | tee -a "$ab"
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+ \S+ \S+) (A|B) \[.*\] round \d+: p50 ([0-9.]+)", line)
    if m: runs.setdefault((m.group(1), m.group(2)), []).append(float(m.group(3)))
for key in sorted({k[0] for k in runs}):
    a, b = runs.get((key, "A"), []), runs.get((key, "B"), [])
    if a and b:
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"median {key}: A {ma:.4f} ms, B {mb:.4f} ms, B/A {mb / ma:.3f}")
PY
