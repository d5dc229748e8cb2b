#!/usr/bin/env bash
# Merge what one call of configs/experiments/gpu_session.sh brought back into results/<suite>_gpu/:
#   bash scripts/merge_device_results.sh DIR SUITE TAG
# DIR: the call's returned $OUT folder (the device tool's files_at plus the call's sub-folder, e.g.
# /work/.device/4/c3); SUITE: e.g. credible_recall; TAG: names the console logs, e.g. session19_call3.
# - the suite's run tree from artifacts.tgz (reports, per-run results, finished recall rows) over results/<suite>_gpu/;
# - each lane's log of the suite as results/<suite>_gpu/console_<TAG>_lane<i>.log;
# - the cut recall models' checkpoints (resume_<suite>.tar.part-NNN) into results/<suite>_gpu/resume/ (git ignores
#   it), one tar per model, merged with what it held (below); carry it in the next call: `carry:
#   ["results/<suite>_gpu/resume"]`, or only `results/<suite>_gpu/resume/<cell>` or `.../<cell>/seed<s>`.
set -euo pipefail
source "$(dirname "$0")/resume_tars.sh"  # unpack_resume: the layout of the kept checkpoints
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
# The cut models' checkpoints. logs/resume_<suite>.list names what the call exported (every model it left unfinished,
# carried or cut there). resume/ keeps one tar per model, resume/<cell>/seed<s>/<task>/part-NNN (<= 15 MiB each), so
# that a call can carry one cell's or seed's checkpoints (a call carries 64 MiB with the tree; one 2-layer d 128 model
# with its optimizer is ~30 MiB). After the merge resume/ holds
#   - every model the call exported (it supersedes an older checkpoint of the same model), and
#   - every model resume/ held before that the call did not finish (not carried to it, or carried and cut again
#     without an export): its recall_<task>.json is not in the merged run tree. Before session 25 resume/ became
#     exactly the export, so a call that did not carry it deleted its checkpoints.
# Parts that do not make one complete tar (the device tool left some behind: more than 8 files or 64 MiB) are an
# error that leaves resume/ as it was; the run tree and logs are merged all the same.
list="$tmp/logs/resume_${suite}.list"
[ -f "$list" ] || { echo "merged $dir into $dest (no resume list: resume/ left as it was)"; exit 0; }
new="$tmp/new_resume" old="$tmp/old_resume"
mkdir -p "$new" "$old"
parts=("$dir/resume_${suite}.tar.part-"*)
if [ -s "$list" ]; then
  [ -f "${parts[0]}" ] || { echo "error: the call exported checkpoints ($list) but no resume_${suite}.tar.part-* came back; resume/ left as it was" >&2; exit 2; }
  for i in "${!parts[@]}"; do
    want=$(printf '%s/resume_%s.tar.part-%03d' "$dir" "$suite" "$i")
    [ "${parts[$i]}" = "$want" ] || { echo "error: $want did not come back (${#parts[@]} part(s) did): the call's checkpoints are incomplete; resume/ left as it was" >&2; exit 2; }
  done
  cat "${parts[@]}" | tar xf - -C "$new" 2>/dev/null \
    || { echo "error: the ${#parts[@]} part(s) of resume_${suite}.tar do not make a complete tar (the last one stayed behind?); resume/ left as it was" >&2; exit 2; }
  while read -r r; do
    [ -d "$new/$r" ] || { echo "error: the list names $r, which the parts do not hold; resume/ left as it was" >&2; exit 2; }
  done < "$list"
fi
[ ! -d "$dest/resume" ] || unpack_resume "$dest/resume" "$old" || true  # a broken tar is named and dropped
kept=0
for r in $(cd "$old" && find . -type d -name 'recall_*.resume' ! -empty -prune | sed 's|^\./||' | sort); do
  [ -d "$new/$r" ] || [ -f "$dest/${r%.resume}.json" ] && continue
  mkdir -p "$new/$(dirname "$r")" && cp -r "$old/$r" "$new/$r" && kept=$(( kept + 1 ))
done
# built beside resume/ and swapped in whole: nothing half-written if this stops midway
rm -rf "$dest/resume.new"
n=0
for r in $(cd "$new" && find . -type d -name 'recall_*.resume' ! -empty -prune | sed 's|^\./||' | sort); do
  # cells/<cell>/seed<s>/recall_<task>.resume -> resume/<cell>/seed<s>/<task>/part-NNN
  rel=${r#cells/}; base=$(basename "$rel" .resume)
  target="$dest/resume.new/$(dirname "$rel")/${base#recall_}"
  mkdir -p "$target"
  (cd "$new" && tar cf - "$r") | split -b 15M -a 3 -d - "$target/part-"
  n=$(( n + 1 ))
done
rm -rf "$dest/resume"
[ "$n" -eq 0 ] || mv "$dest/resume.new" "$dest/resume"
[ "$n" -eq 0 ] || echo "resume: $n model(s) in $dest/resume ($(wc -l < "$list") from this call, $kept kept from before; carry the folder, or a cell's or seed's under it)"
echo "merged $dir into $dest"
