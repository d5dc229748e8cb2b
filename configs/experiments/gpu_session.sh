#!/usr/bin/env bash
# One H200 session (<= ~9 minutes) finishing the GPU suites of issue 6. From the repository root:
#   PYTHONPATH=. OUT=/some/dir LIMIT=480 bash configs/experiments/gpu_session.sh
# Runs the suites at once, each with --jobs (concurrent (cell, seed) subprocesses on the one GPU) under
# `timeout $LIMIT`, rewrites every report from the finished runs (--report-only), packs the small artifacts (md, json,
# png, logs; no checkpoints) into $OUT/artifacts.tgz and prints the tables.
# Lessons of the first use (RESULTS.md section G): the GPU is saturated by ~3 concurrent `small` runs (more only adds
# memory pressure), and cells that run the S4D op (s4d, s4d_rope, dual_input_no_q) have no GPU kernel yet and take
# ~125 GB through the PyTorch reference; they run only with S4D=1, once the S4D Triton kernel is in.
# Finished runs found under $RUNS (e.g. carried over) are skipped, unfinished ones resume from their checkpoints.
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
CUBE="full no_rope single_input_q"; LEN="softmax interdomain"
if [ "${S4D:-0}" = 1 ]; then CUBE="$CUBE dual_input_no_q s4d s4d_rope"; LEN="$LEN s4d"; fi
timeout "$LIMIT" $E $C/natsl_vs_baselines.yaml out_dir=$RUNS/natsl_vs_baselines --jobs 2 > "$OUT/natsl.log" 2>&1 &
P1=$!
( timeout "$LIMIT" $E $C/interdomain_length.yaml out_dir=$RUNS/interdomain_length --jobs 2 --only $LEN \
    > "$OUT/length.log" 2>&1
  left=$(( LIMIT - ($(date +%s) - T0) ))
  [ "$left" -gt 30 ] && timeout "$left" $E $C/interdomain_cube.yaml out_dir=$RUNS/interdomain_cube --jobs 2 \
    --only $CUBE > "$OUT/cube.log" 2>&1 ) &
P2=$!
wait $P1 $P2  # not a bare `wait`: that would also wait for nvidia-smi
echo "training phase: $(( $(date +%s) - T0 )) s"
kill $SMI
for s in natsl_vs_baselines interdomain_cube interdomain_length; do
  [ -d $RUNS/$s ] && $E $C/$s.yaml out_dir=$RUNS/$s --report-only > /dev/null 2>&1
done
# one archive: the device tool returns a limited number of files and folder depth
(cd $RUNS && tar czf "$OUT/artifacts.tgz" --exclude=checkpoints --exclude=tokenizer .)
for s in natsl_vs_baselines interdomain_cube interdomain_length; do
  echo "===== $s"; sed -n '/^| cell/,/^$/p' "$RUNS/$s/results.md" 2>/dev/null
done
echo "total: $(( $(date +%s) - T0 )) s"
