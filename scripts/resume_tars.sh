# Sourced by configs/experiments/gpu_session.sh and scripts/merge_device_results.sh: how the checkpoints of cut recall
# models are kept in results/<suite>_gpu/resume/ — one tar per model in <= 15 MiB parts, <cell>/seed<s>/<task>/part-NNN
# (session 25), or, before that, the whole suite's in one tar, resume.tar.part-NNN.

# unpack_resume RESUME_DIR DEST: extract every tar kept under RESUME_DIR into DEST (the run folder layout
# cells/<cell>/seed<s>/recall_<task>.resume/...). A tar that does not read whole is named on stderr and skipped; the
# status is then 1.
unpack_resume() {
  local first rc=0
  while read -r first; do
    cat "${first%000}"* | tar xf - -C "$2" 2>/dev/null \
      || { echo "warning: ${first%000}* is not a complete tar: skipped" >&2; rc=1; }
  done < <(find "$1" \( -name part-000 -o -name resume.tar.part-000 \) | sort)
  return "$rc"
}
