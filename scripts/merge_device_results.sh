#!/usr/bin/env bash
# Merge what one call of configs/experiments/gpu_session.sh brought back into results/<suite>_gpu/:
#   bash scripts/merge_device_results.sh DIR SUITE TAG
# DIR: the call's returned $OUT folder (the device tool's files_at plus the call's sub-folder, e.g.
# /work/.device/4/c3); SUITE: e.g. credible_recall; TAG: names the console logs, e.g. session19_call3.
# - the suite's run tree from artifacts.tgz (reports, per-run results, finished recall rows) over results/<suite>_gpu/;
# - each lane's log of the suite as results/<suite>_gpu/console_<TAG>_lane<i>.log;
# - the cut recall models' checkpoint parts (resume_<suite>.tar.part-NNN) as results/<suite>_gpu/resume/ (git ignores
#   it; carry it in the next call: `carry: ["results/<suite>_gpu/resume"]`), replaced by exactly what the call
#   exported (its logs/resume_<suite>.list; removed when nothing is left to resume). Archives without that list
#   (before session 19's fix) leave resume/ as it was.
set -euo pipefail
dir=${1:?DIR}; suite=${2:?SUITE}; tag=${3:?TAG}
dest="results/${suite}_gpu"
[ -f "$dir/artifacts.tgz" ] || { echo "error: $dir/artifacts.tgz not found" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$dir/artifacts.tgz" -C "$tmp"
[ -d "$tmp/$suite" ] || { echo "error: the archive has no run folder of suite $suite" >&2; exit 2; }
mkdir -p "$dest"
cp -r "$tmp/$suite/." "$dest/"
for log in "$tmp"/logs/lane*_"$suite".log "$dir"/lane*_"$suite".log; do
  [ -f "$log" ] || continue
  lane=$(basename "$log" | sed 's/^lane\([0-9]*\)_.*/\1/')
  cp "$log" "$dest/console_${tag}_lane${lane}.log"
done
# the cut models' checkpoints: logs/resume_<suite>.list names what the call exported (every model still to resume);
# resume/ becomes exactly that, emptied when the list is (those models finished: their rows are in the run tree)
list="$tmp/logs/resume_${suite}.list"
parts=("$dir/resume_${suite}.tar.part-"*)
if [ -f "$list" ]; then
  if [ -s "$list" ] && [ ! -f "${parts[0]}" ]; then
    echo "error: the call exported checkpoints ($list) but no resume_${suite}.tar.part-* came back" >&2; exit 2
  fi
  rm -rf "$dest/resume"
  if [ -s "$list" ]; then
    mkdir -p "$dest/resume"
    for p in "${parts[@]}"; do cp "$p" "$dest/resume/resume.tar.part-${p##*.part-}"; done
    echo "resume: ${#parts[@]} part(s) in $dest/resume (carry it in the next call): $(wc -l < "$list") task(s) with a cut model"
  fi
fi
echo "merged $dir into $dest"
