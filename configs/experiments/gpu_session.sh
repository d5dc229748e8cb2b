#!/usr/bin/env bash
# One device call (<= 10 minutes) of the GPU suites of issue 6, spread over "lanes": each lane is a list of suite
# invocations run one after the other on its own GPU (lane i -> GPU i modulo the GPUs present), all lanes at once.
# From the repository root:
#   PYTHONPATH=. OUT=/some/dir LIMIT=540 \
#     LANE0="natsl_vs_baselines seeds=[1] --only natsl_hybrid; interdomain_cube --jobs 2 --only dual_input_no_q" \
#     LANE1="interdomain_vs_s4d --jobs 2" bash configs/experiments/gpu_session.sh
# LANE0 ... LANE7. Each item is "<suite> [overrides] [runner args]" (configs/experiments/<suite>.yaml, out_dir
# $RUNS/<suite>); items are separated by ';'. Overrides go before --only (which takes every word after it) and
# contain no spaces (`seeds=[0,1]`, not `seeds=[0, 1]`): items are split at blanks, quotes are not honoured.
# `--tasks T ...` (before --only) trains only those recall tasks of the cells, e.g. one task of several cells per call:
#   LANE0="credible_recall seeds=[0] --tasks mqar_t256 --only cell_a cell_b"  (a cell finishes when all its tasks have)
# An item "!<shell command>" runs that command on the lane's GPU instead (no ';' inside it; log $OUT/lane<i>_cmd.log).
# Every item runs under `timeout` of the time left; an item that would start with < MIN_LEFT s (30) left is skipped. Logs are
# appended to $OUT/lane<i>_<suite>.log. The same suite may appear in several lanes only with disjoint cells or seeds.
# Finished runs of earlier sessions are imported first (results/<suite>_gpu/results.json, via --import-results; log
# $OUT/import_<suite>.log), so they are skipped and appear in the reports; so are the finished recall tasks and sweep
# models of cut runs (results/<suite>_gpu/cells/*/seed*/recall_*.json). Afterwards every touched report is
# rewritten from all finished runs of the seeds found on disk (--report-only), the small artifacts (md, json, png,
# logs; no checkpoints) and the call's logs (logs/) are packed into $OUT/artifacts.tgz and the tables are printed.
# The per-epoch checkpoints of recall models a call cut come back as $OUT/resume_<suite>.tar.part-NNN (one tar,
# <= 15 MiB parts; whole models only, while they fit in the device tool's return: see the export below);
# `bash scripts/merge_device_results.sh <returned folder> <suite> <tag>` merges a call's return into
# results/<suite>_gpu/ (the checkpoints as one tar per model in results/<suite>_gpu/resume/<cell>/seed<s>/<task>/,
# ignored by git); carried (`carry: ["results/<suite>_gpu/resume"]`, or a model's folder under it: a call carries 64
# MiB with the ~6 MiB tree, one ~29 MiB d 128 model), the next call resumes those models at their last finished epoch.
# Lessons of earlier calls (RESULTS.md sections G, S): one H200 is saturated by ~3 concurrent `small` runs (more only
# adds memory pressure); an S4D-only `small` run takes ~280 s alone; a cut-off run's checkpoints do not come back
# from the device, so size items to finish. Session 11: put several runs of a suite in ONE item (`seeds=[0,1] --only
# CELL`): the runner runs them in one process, so every run after the first reuses its data and compiled graphs
# (≈ 60 s of compilation saved per run of a credible cell). Session 22: the 2-layer d 128 recall models are the
# opposite case: in a one-lane call nvidia-smi read 0% GPU in 22 of 57 samples (the compilations, ≈ 50-77 s per
# task, CPU only), so two lanes on the one GPU let one lane compile while the other trains (not A/B-timed).
set -u
# unpack_resume: the layout of the kept checkpoints (beside this script's repository, wherever it runs from)
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/resume_tars.sh" || exit 2
OUT=${OUT:?set OUT}
LIMIT=${LIMIT:-540}
# the runs of one call share their tokenized corpus (data/token_cache.py): only the first one encodes it
export HYBRID_ATTENTION_TOKEN_CACHE=${HYBRID_ATTENTION_TOKEN_CACHE:-/tmp/token_cache}
MIN_LEFT=${MIN_LEFT:-30}  # an item that would start with less time left is skipped (a cut run's checkpoints are lost)
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
  local gpu=$(( $1 % NGPU )) item left rc
  local -a args items
  IFS=';' read -ra items <<< "$2"
  for item in "${items[@]}"; do
    read -ra args <<< "$item"
    [ "${#args[@]}" -gt 0 ] || continue
    left=$(( LIMIT - ($(date +%s) - T0) ))
    if [ "$left" -lt "$MIN_LEFT" ]; then echo "lane $1: ${left} s < MIN_LEFT=${MIN_LEFT} s left, skipped: $item"; continue; fi
    echo "lane $1 (GPU $gpu, ${left} s left): ${args[*]}"
    if [ "${args[0]:0:1}" = "!" ]; then  # a shell command, e.g. "!bash benchmarks/gpu_checks.sh"
      CUDA_VISIBLE_DEVICES=$gpu timeout "$left" bash -c "${item#*!}" >> "$OUT/lane$1_cmd.log" 2>&1
      rc=$?
      echo "exit $rc of: ${item#*!}" >> "$OUT/lane$1_cmd.log"
    else
      # the item heads its output in the suite's lane log, which the merge keeps as a console log: the command of
      # every number in it (the --tasks and overrides are not in the runner's own lines)
      echo "item: ${args[*]}" >> "$OUT/lane$1_${args[0]}.log"
      CUDA_VISIBLE_DEVICES=$gpu timeout "$left" $E "$C/${args[0]}.yaml" "out_dir=$RUNS/${args[0]}" "${args[@]:1}" \
        >> "$OUT/lane$1_${args[0]}.log" 2>&1
      rc=$?
    fi
    echo "lane $1: ${args[0]} exit $rc after $(( $(date +%s) - T0 )) s"
  done
}

# CPU threads per lane: the cores shared by the lanes (session 16: three recall lanes, each with torch's default of one
# thread per core, on 16 cores; their example generators and Python launch loops competed). A set OMP_NUM_THREADS wins.
nlanes=0
for i in 0 1 2 3 4 5 6 7; do var="LANE$i"; [ -n "${!var:-}" ] && nlanes=$(( nlanes + 1 )); done
threads=$(( $(nproc) / (nlanes > 0 ? nlanes : 1) ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}
echo "lanes: $nlanes, OMP_NUM_THREADS=$OMP_NUM_THREADS per lane"

pids=()
for i in 0 1 2 3 4 5 6 7; do
  var="LANE$i"
  [ -n "${!var:-}" ] || continue
  for item in $(echo "${!var}" | tr ';' '\n' | awk '{print $1}' | grep -v '^!'); do
    case " $SUITES " in *" $item "*) ;; *)
      SUITES="$SUITES $item"
      prev="results/${item}_gpu/results.json"
      [ -f "$prev" ] && $E "$C/$item.yaml" "out_dir=$RUNS/$item" --import-results "$prev" --list \
        > "$OUT/import_$item.log" 2>&1
      # the finished recall tasks / sweep models of runs an earlier call cut (recall_<task>.json and .rows.json,
      # merged into results/<suite>_gpu/cells/ from its artifacts): the runner trains only the rest
      [ -d "results/${item}_gpu/cells" ] && (cd "results/${item}_gpu" && find cells -name 'recall_*.json' \
        -exec sh -c 'mkdir -p "$0/${1%/*}" && cp -n "$1" "$0/$1"' "$RUNS/$item" {} \;)
      # and the per-epoch checkpoints of recall models a call cut (recall_<task>.resume/): they come back as one tar
      # in <= 15 MiB parts; merge_device_results.sh keeps them as one tar per model in results/<suite>_gpu/resume/
      # <cell>/seed<s>/<task>/part-NNN (not in git: carry the folder, or one cell's or seed's); each tar is unpacked
      # here (resume.tar.part-NNN: the one-tar layout before session 25)
      [ -d "results/${item}_gpu/resume" ] && mkdir -p "$RUNS/$item" \
        && unpack_resume "results/${item}_gpu/resume" "$RUNS/$item" ;;
    esac
  done
  lane "$i" "${!var}" &
  pids+=($!)
done
if [ "${#pids[@]}" -eq 0 ]; then
  echo "error: set at least one of LANE0 ... LANE7" >&2
  kill $SMI 2>/dev/null
  exit 2
fi
wait "${pids[@]}"  # not a bare `wait`: that would also wait for nvidia-smi
echo "training phase: $(( $(date +%s) - T0 )) s"
kill $SMI 2>/dev/null
for s in $SUITES; do
  # every seed that has a run directory, so that items with seeds=[...] outside the YAML's list are reported too
  seeds=$(ls -d "$RUNS/$s"/cells/*/seed* 2>/dev/null | sed 's/.*seed//' | sort -un | paste -sd, -)
  $E "$C/$s.yaml" "out_dir=$RUNS/$s" ${seeds:+"seeds=[$seeds]"} --report-only > "$OUT/report_$s.log" 2>&1
done
mkdir -p "$RUNS" "$OUT/logs"
# the per-epoch checkpoints of recall models this call cut (runner.py), or carried in and not yet finished: one tar per
# suite, split into parts of at most 15 MiB, $OUT/resume_<suite>.tar.part-000, -001, ... (a returned file is at most
# 16 MiB; session 19's first export, the run tree copied under $OUT/resume/, did not come back: too many folders
# down). logs/resume_<suite>.list (in the archive) names what the parts hold, empty when nothing is left to resume;
# scripts/merge_device_results.sh keeps those and what results/<suite>_gpu/resume/ held that the call did not finish.
# The device tool returns at most RETURN_FILES (8) files and RETURN_MIB (64) MiB in all, and leaves the rest behind
# in no useful order (session 25, call 2: parts 000 and 001 of a three-part tar stayed behind, so no model of it came
# back). So models are exported whole, one after the other, while their parts fit beside artifacts.tgz (2 MiB kept
# for it); a model that does not fit is named on stdout and is lost (one 2-layer d 128 model with its optimizer is
# ~30 MiB: two fit in one call).
part_bytes=$(( 15 * 1024 * 1024 ))
LOST=""
files_left=$(( ${RETURN_FILES:-8} - 1 ))
bytes_left=$(( (${RETURN_MIB:-64} - 2) * 1024 * 1024 ))
for s in $SUITES; do
  : > "$OUT/logs/resume_$s.list"
  [ -d "$RUNS/$s/cells" ] || continue
  # a finished task's checkpoint is not exported (its recall_<task>.json exists): on a warm machine a carried folder
  # is still in the work tree and unpacked again after the model finished (session 22, call 3)
  size=0
  while read -r r; do
    [ -f "$RUNS/$s/${r%.resume}.json" ] && continue
    b=$(( $(du -sb "$RUNS/$s/$r" | cut -f1) + 65536 ))  # + tar headers and padding
    n=$(( (size + b + part_bytes - 1) / part_bytes ))
    if [ "$n" -le "$files_left" ] && [ $(( size + b )) -le "$bytes_left" ]; then
      echo "$r" >> "$OUT/logs/resume_$s.list"; size=$(( size + b ))
    else
      LOST="${LOST}WARNING: $s: the checkpoint $r does not fit in what comes back ($files_left files, $(( bytes_left / 1048576 )) MiB left): not exported, lost
"
    fi
  done < <(cd "$RUNS/$s" && find cells -type d -name 'recall_*.resume' ! -empty -prune | sort)
  [ -s "$OUT/logs/resume_$s.list" ] || continue
  (cd "$RUNS/$s" && tar cf - -T "$OUT/logs/resume_$s.list") | split -b 15M -a 3 -d - "$OUT/resume_$s.tar.part-"
  for f in "$OUT/resume_$s.tar.part-"*; do
    files_left=$(( files_left - 1 )); bytes_left=$(( bytes_left - $(stat -c %s "$f") ))
  done
done
# the end of every "!" item's log, where the operator reads the call's output (session 26: a pytest item whose -k
# selected nothing went unseen: its log is only in the archive)
for f in "$OUT"/lane*_cmd.log; do
  [ -f "$f" ] && { echo "===== ${f##*/} (last 5 lines)"; tail -n 5 "$f"; }
done
# one archive, with the call's logs under logs/ (moved out of $OUT): the device tool returns at most 8 files, at most
# 2 folders down, 64 MiB in all
(cd "$OUT" && mv lane*.log import_*.log report_*.log nvidia_smi.csv logs/ 2>/dev/null)
tar czf "$OUT/artifacts.tgz" --exclude=checkpoints --exclude=tokenizer --exclude='recall_*.resume' -C "$RUNS" . \
  -C "$OUT" logs && rm -r "$OUT/logs"
for s in $SUITES; do
  echo "===== $s"; sed -n '/^| cell/,/^$/p' "$RUNS/$s/results.md" 2>/dev/null
done
# what did not fit in the return, and a check of the return itself, last, where the operator reads them
printf '%s' "$LOST"
nret=$(find "$OUT" -maxdepth 1 -type f | wc -l)
mret=$(find "$OUT" -maxdepth 1 -type f -printf '%s\n' | awk '{s += $1} END {print int((s + 1048575) / 1048576)}')
if [ "$nret" -gt "${RETURN_FILES:-8}" ] || [ "$mret" -gt "${RETURN_MIB:-64}" ]; then
  echo "WARNING: \$OUT holds $nret files, $mret MiB: over what comes back (${RETURN_FILES:-8} files, ${RETURN_MIB:-64} MiB)"
fi
echo "total: $(( $(date +%s) - T0 )) s"
