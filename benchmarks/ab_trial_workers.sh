#!/bin/bash
# Does a tuning trial's own worker count matter? Two mnist_path FedAvg trials of 4 rounds run at
# once (as `pflower tune --workers 2` runs them), each with the fork backend's default workers (one
# per CPU) or backend.workers=1, alternating, 3 pairs each; prints each pair's wall time and
# checks that the rows are the same. Run from the repository with the data root in PFLOWER_DATA;
# results: benchmarks/results/suite_timing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
COMMON=(checkpoint.every=0 +experiment=fedala_table2_cpu partition=pflib_pathological
  split.subsample_fraction=0.1 rounds=4 strategy=fedavg seed=0 split.val_fraction=0.2
  split.evaluate_on=val "eval.stages=[L1]" eval.client_global_test=off plots=false
  train.momentum=0.5 progress=false)
run() { python -m pflower "${COMMON[@]}" "$@" > /dev/null 2>&1; }
run train.lr=0.03 output_dir="$OUT/warm"  # the page cache and the dataset cache, warm
for rep in 1 2 3; do
  for arm in default one; do
    extra=(); [ $arm = one ] && extra=(backend.workers=1)
    start=$EPOCHREALTIME
    run train.lr=0.03 "${extra[@]}" output_dir="$OUT/$arm-$rep-a" & a=$!
    run train.lr=0.01 "${extra[@]}" output_dir="$OUT/$arm-$rep-b" & b=$!
    wait $a && wait $b  # a failed run stops the script (set -e)
    echo "$arm pair $rep: $(python -c "print(f'{$EPOCHREALTIME - $start:.1f} s')")"
  done
done
rows() { grep -v '"stage": "time"' "$1/metrics.jsonl"; }
for rep in 1 2 3; do
  for run in a b; do
    [ -s "$OUT/default-$rep-$run/metrics.jsonl" ] || { echo "no rows"; exit 1; }
    cmp -s <(rows "$OUT/default-$rep-$run") <(rows "$OUT/one-$rep-$run") \
      || { echo "rows differ"; exit 1; }
  done
done
echo "rows identical"
