#!/usr/bin/env bash
# One device call (<= 10 minutes) of the GPU suites of issue 6, spread over "lanes": each lane is a list of suite
# invocations run one after the other on its own GPU (lane i -> GPU i modulo the GPUs present), all lanes at once.
# From the repository root:
#   PYTHONPATH=. OUT=/some/dir LIMIT=540 \
#     LANE0="natsl_vs_baselines seeds=[1] --only natsl_hybrid; interdomain_cube --jobs 2 --only dual_input_no_q" \
#     LANE1="interdomain_vs_s4d --jobs 2" bash configs/experiments/gpu_session.sh
# Each item is "<suite> [overrides] [runner args]" (overrides before --only, which takes every word after it) (configs/experiments/<suite>.yaml, out_dir $RUNS/<suite>); items are separated
# by ';'. An item "!<shell command>" runs that command on the lane's GPU instead (log: $OUT/lane<i>_cmd.log).
# Every item runs under `timeout` of the time left; an item that starts with < 30 s left is skipped.
# Finished runs of earlier sessions are imported first (results/<suite>_gpu/results.json, via --import-results), so
# they are skipped and appear in the reports. Afterwards every touched report is rewritten from the finished runs
# (--report-only), the small artifacts (md, json, png, logs; no checkpoints) are packed into $OUT/artifacts.tgz and
# the tables are printed.
# Lessons of earlier calls (RESULTS.md section G): one H200 is saturated by ~3 concurrent `small` runs (more only
# adds memory pressure); a cut-off run's checkpoints do not come back from the device, so size items to finish.
set -u
OUT=${OUT:?set OUT}
LIMIT=${LIMIT:-540}
RUNS=${RUNS:-/tmp/gx}
E="python -m hybrid_attention.experiments"
C=configs/experiments
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$NGPU" -ge 1 ] || NGPU=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv -l 10 > "$OUT/nvidia_smi.csv" 2>&1 &
SMI=$!
T0=$(date +%s)
SUITES=""

lane() {  # lane INDEX "item; item; ..."
  local gpu=$(( $1 % NGPU )) item left
  local -a args
  IFS=';' read -ra items <<< "$2"
  for item in "${items[@]}"; do
    read -ra args <<< "$item"
    [ "${#args[@]}" -gt 0 ] || continue
    left=$(( LIMIT - ($(date +%s) - T0) ))
    if [ "$left" -lt 30 ]; then echo "lane $1: no time left for: $item"; continue; fi
    echo "lane $1 (GPU $gpu, ${left} s left): ${args[*]}"
    if [ "${args[0]:0:1}" = "!" ]; then  # a shell command, e.g. "!bash benchmarks/gpu_checks.sh"
      CUDA_VISIBLE_DEVICES=$gpu timeout "$left" bash -c "${item#*!}" > "$OUT/lane$1_cmd.log" 2>&1
    else
      CUDA_VISIBLE_DEVICES=$gpu timeout "$left" $E "$C/${args[0]}.yaml" "out_dir=$RUNS/${args[0]}" "${args[@]:1}" \
        > "$OUT/lane$1_${args[0]}.log" 2>&1
    fi
    echo "lane $1: ${args[0]} exit $? after $(( $(date +%s) - T0 )) s"
  done
}

pids=()
for i in 0 1 2 3; do
  var="LANE$i"
  [ -n "${!var:-}" ] || continue
  for item in $(echo "${!var}" | tr ';' '\n' | awk '{print $1}' | grep -v '^!'); do
    case " $SUITES " in *" $item "*) ;; *)
      SUITES="$SUITES $item"
      prev="results/${item}_gpu/results.json"
      [ -f "$prev" ] && $E "$C/$item.yaml" "out_dir=$RUNS/$item" --import-results "$prev" --list > /dev/null 2>&1 ;;
    esac
  done
  lane "$i" "${!var}" &
  pids+=($!)
done
wait "${pids[@]}"  # not a bare `wait`: that would also wait for nvidia-smi
echo "training phase: $(( $(date +%s) - T0 )) s"
kill $SMI 2>/dev/null
for s in $SUITES; do
  $E "$C/$s.yaml" "out_dir=$RUNS/$s" --report-only > /dev/null 2>&1
done
# one archive: the device tool returns a limited number of files and folder depth
[ -d "$RUNS" ] && (cd "$RUNS" && tar czf "$OUT/artifacts.tgz" --exclude=checkpoints --exclude=tokenizer .)
for s in $SUITES; do
  echo "===== $s"; sed -n '/^| cell/,/^$/p' "$RUNS/$s/results.md" 2>/dev/null
done
echo "total: $(( $(date +%s) - T0 )) s"
