#!/usr/bin/env bash
# One ~9-minute H200 session running several suites at once (issue 6). Usage, from the repository root:
#   PYTHONPATH=. OUT=/some/dir LIMIT=480 bash configs/experiments/gpu_session.sh
# Each suite runs with --jobs (concurrent (cell, seed) subprocesses on the one GPU) under `timeout $LIMIT`; then
# every suite's report is rewritten from the finished runs (--report-only) and the small artifacts (md, json, png,
# logs; no checkpoints) are copied to $OUT/<suite>_gpu/. S4D-only cells are left out (no GPU kernel yet): run them
# later with e.g. `python -m hybrid_attention.experiments configs/experiments/interdomain_cube.yaml --only s4d s4d_rope`.
set -u
OUT=${OUT:?set OUT}
LIMIT=${LIMIT:-480}
RUNS=${RUNS:-/tmp/gx}
E="python -m hybrid_attention.experiments"
C=configs/experiments
mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 10 > "$OUT/nvidia_smi.csv" 2>&1 &
SMI=$!
T0=$(date +%s)
timeout "$LIMIT" $E $C/natsl_vs_baselines.yaml out_dir=$RUNS/natsl_vs_baselines --jobs 5 > "$OUT/natsl.log" 2>&1 &
P1=$!
( timeout "$LIMIT" $E $C/interdomain_cube.yaml out_dir=$RUNS/interdomain_cube --jobs 3 \
    --only full no_rope single_input_q dual_input_no_q > "$OUT/cube.log" 2>&1
  left=$(( LIMIT - ($(date +%s) - T0) ))
  [ "$left" -gt 30 ] && timeout "$left" $E $C/interdomain_length.yaml out_dir=$RUNS/interdomain_length --jobs 3 \
    --only softmax interdomain > "$OUT/length.log" 2>&1 ) &
P2=$!
timeout "$LIMIT" $E $C/recall.yaml out_dir=$RUNS/recall --jobs 4 \
    --only softmax interdomain gdn gdn_hybrid natsl_hybrid > "$OUT/recall.log" 2>&1 &
P3=$!
wait $P1 $P2 $P3
echo "training phase: $(( $(date +%s) - T0 )) s"
kill $SMI
for s in natsl_vs_baselines interdomain_cube interdomain_length recall; do
  [ -d $RUNS/$s ] || continue
  $E $C/$s.yaml out_dir=$RUNS/$s --report-only > /dev/null 2>&1
  d="$OUT/${s}_gpu"; mkdir -p "$d"
  cp $RUNS/$s/results.md $RUNS/$s/results.json $RUNS/$s/*.png "$d"/ 2>/dev/null
  (cd $RUNS/$s && find cells \( -name result.json -o -name worker.log -o -name error.txt -o -name 'recall_*.json' \
     -o -name metrics.jsonl \) -size -2M -exec cp --parents {} "$d"/ \;)
done
for s in natsl_vs_baselines interdomain_cube interdomain_length recall; do
  echo "===== $s"; sed -n '/^| cell/,/^$/p;/accuracy/p' "$OUT/${s}_gpu/results.md" 2>/dev/null | head -40
done
echo "total: $(( $(date +%s) - T0 )) s"
