#!/usr/bin/env bash
# One invocation (<= LIMIT seconds, 10 minutes on an H200) that first checks and then times the training and decode
# paths, from the repository root:
#   OUT=/some/dir LIMIT=590 bash benchmarks/gpu_timings.sh
# 1. correctness, two processes at once (no timing runs beside them): the op and serving test suites on CUDA (the
#    Triton kernels natively, the compiled + CUDA-graph-captured decode step) and benchmarks.gpu_compile_check
#    (compiled vs eager loss and gradients of a 2-layer model of every mixer);
# 2. timings, one process at a time: `bench train` compiled at small B=16 x 2048 for every mixer,
#    benchmarks.s4d_conv (FFT vs Toeplitz, op and compiled model), then decode (StaticDecoder, compiled step captured
#    in CUDA graphs) of the 340M / 1.3B presets at 1K and 128K with whatever time is left (LIMIT, seconds).
# Each part's log is $OUT/<part>.log; JSON results land in $OUT. Parts and rows by environment (defaults in brackets):
#   CHECKS=1 [1]  PYTEST_PATHS [tests/ops tests/serving]  COMPILE_MIXERS [all]  COMPILE_SCOPE [model; or blocks]
#   TRAIN_MODELS [softmax interdomain s4d gdn natsl]  TRAIN_VARIANTS [compiled]  TRAIN_SHAPES [16x2048]
#   TRAIN_QUICK=1 [1] (0: the 340M rows too, e.g. TRAIN_MODELS="transformer-340m gdn-340m" TRAIN_SHAPES=4x4096)
#   TRAIN_PROFILE [0: N profiles N more steps of every train row: kernel time vs GPU idle, launches, top kernels]
#   TRAIN_STEPS, TRAIN_WARMUP [the bench's: 10, 3]
#   S4D_CONV=1 [1]
#   PROFILE_TRAIN [none: e.g. "s4d"]  PROFILE_DECODE [none: e.g. "gdn-340m transformer-340m"; with and without the
#   fused decode GEMVs]  PROFILE_DECODE_LOG [none: 1 adds --log-compile (per-phase compile / JIT times, stack dumps
#   every 60 s in $OUT/profile_decode.log)]
#   DECODE_MODELS [natsl-hybrid-340m,gdn-340m,transformer-340m,interdomain-1.3b]  DECODE_CONTEXTS [1024,131072]
#   DECODE_BATCHES [all rows: 1,8]
#   DECODE_AUTOTUNE [none: a preset timed with compile mode max-autotune-no-cudagraphs at 1K, B = 1]
#   PREFILL_MODELS [none: e.g. "gdn-340m,natsl-hybrid-340m,transformer-340m"]  PREFILL_LENGTHS [131072]
#   PREFILL_COMPILE=0 [0]  (benchmarks.models --sections prefill, the whole-model prefill; 1: torch.compile)
#   PROFILE_PREFILL [none: e.g. "gdn-340m natsl-hybrid-340m"]  (benchmarks.profile_prefill: top kernels of one 128K
#   prefill, eager and compiled, and the wall vs summed-kernel time)
#   NATSL_OPS=0 [0]  (benchmarks.natsl_ops: float64 correctness, the op timings at 4K / 16K / 64K and the profile)
#   NATSL_SWEEP=0 [0]  (benchmarks.natsl_ops --sweep-only: the GDN / chunk-attention kernel configs; with NATSL_OPS=1
#   both in one process, the sweep last)  NATSL_SWEEP_KINDS [softmax,fla_gdn,gdn] (the sweep's job kinds)
#   DECODE_ATTN_SWEEP=0 [0]  (benchmarks.decode_attention_ops: the split-KV decode kernel's num_splits x BLOCK_N)
#   RECALL_SPEED=0 [0]  (benchmarks.recall_speed: the recall trainer's step eager / compiled per credible_recall cell
#   and task, the generator's s/epoch, each cell's projected seconds at the full budget)  RECALL_CELLS [all]
#   S4D_BILINEAR=0 [0]  (benchmarks.s4d_bilinear_ops --quick: float64 check, fwd / fwd+bwd at the training shapes)
#   INTERDOMAIN_REAL=0 [0]  (benchmarks.interdomain_ops --real-passes: the "real" readout in one vs two kernel passes)
#   CAUSAL_CONV=0 [0]  (benchmarks.causal_conv --sweep: the short-convolution op's float64 check, its fwd / fwd+bwd
#   against ShortConvolution's reference eager and compiled at small and 340M shapes, its launch-config sweep)
# Measured costs (H200): checks ≈ 170 s; a compiled `small` train row 17-46 s with its compile; s4d_conv ≈ 260 s
# (≈ 45 s for the op tables, then the packed and the four compiled model rows); a compiled decode step ≈ 50-60 s per (preset, batch, context) point, most of it compile.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-.}"
mkdir -p "$OUT"  # every part's log goes under $OUT: a missing folder would lose them
source benchmarks/fla_wheels.sh  # fla beside ours in the natsl_ops timings and sweep, when its wheels are in .wheels/
export PYTHONPATH=".${FLA_PATH}"
LIMIT=${LIMIT:-590}
T0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
# Seconds for the next part: what is left minus a reserve, at least 1. Never 0: `timeout 0` means no limit, and a part
# that ends exactly at its reserve would give the next one no limit at all.
slot() { local t=$(( $(left) - ${1:-30} )); echo $(( t > 1 ? t : 1 )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if [ "${CHECKS:-1}" = 1 ]; then
  read -ra pytest_paths <<< "${PYTEST_PATHS:-tests/ops tests/serving}"
  timeout -k 10 230 python -m pytest -q -p no:cacheprovider -n 8 "${pytest_paths[@]}" > "$OUT/pytest_gpu.log" 2>&1 &
  P1=$!
  read -ra compile_mixers <<< "${COMPILE_MIXERS:-}"
  timeout -k 10 230 python -m benchmarks.gpu_compile_check --out "$OUT" ${COMPILE_MIXERS:+--mixers "${compile_mixers[@]}"} \
    --scope "${COMPILE_SCOPE:-model}" > "$OUT/compile_check.log" 2>&1 &
  P2=$!
  wait $P1; echo "== pytest tests/ops tests/serving: exit $? after $(( $(date +%s) - T0 )) s"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -20; tail -n 2 "$OUT/pytest_gpu.log"
  wait $P2; echo "== gpu_compile_check: exit $? after $(( $(date +%s) - T0 )) s"; tail -n 12 "$OUT/compile_check.log"
fi

read -ra train_models <<< "${TRAIN_MODELS-softmax interdomain s4d gdn natsl}"
if [ "${#train_models[@]}" -gt 0 ]; then
  read -ra train_variants <<< "${TRAIN_VARIANTS:-compiled}"
  timeout -k 10 $(slot 30) python -m benchmarks.train_speed --models "${train_models[@]}" \
    --variants "${train_variants[@]}" --shapes ${TRAIN_SHAPES:-16x2048} $([ "${TRAIN_QUICK:-1}" = 1 ] && echo --quick) \
    --profile "${TRAIN_PROFILE:-0}" ${TRAIN_STEPS:+--steps "$TRAIN_STEPS"} ${TRAIN_WARMUP:+--warmup "$TRAIN_WARMUP"} \
    --out "$OUT" > "$OUT/train_speed.log" 2>&1
  echo "== bench train: exit $? after $(( $(date +%s) - T0 )) s"; grep -E "^train |^\| |^#### " "$OUT/train_speed.log"
fi

if [ "${S4D_CONV:-1}" = 1 ]; then
  timeout -k 10 260 python -m benchmarks.s4d_conv --model-steps 5 > "$OUT/s4d_conv.log" 2>&1
  echo "== s4d_conv: exit $? after $(( $(date +%s) - T0 )) s"; grep -E "^\||^##" "$OUT/s4d_conv.log"
fi

if [ -n "${PROFILE_TRAIN:-}" ]; then
  read -ra profile_mixers <<< "$PROFILE_TRAIN"
  pt=$(slot 30); [ "$pt" -gt 180 ] && pt=180  # leave the later parts their time
  timeout -k 10 "$pt" python -m benchmarks.profile_train --mixers "${profile_mixers[@]}" \
    > "$OUT/profile_train.log" 2>&1
  echo "== profile_train: exit $? after $(( $(date +%s) - T0 )) s"; grep -E "^###|^\| " "$OUT/profile_train.log"
fi

if [ -n "${PROFILE_DECODE:-}" ]; then
  read -ra profile_presets <<< "$PROFILE_DECODE"
  timeout -k 10 $(slot 30) python -m benchmarks.profile_decode --presets "${profile_presets[@]}" --fused-gemv both \
    ${PROFILE_DECODE_LOG:+--log-compile} > "$OUT/profile_decode.log" 2>&1
  echo "== profile_decode: exit $? after $(( $(date +%s) - T0 )) s"
  grep -E "^###|^\| |^\[log-compile\]" "$OUT/profile_decode.log"
fi

if [ -n "${DECODE_AUTOTUNE:-}" ]; then
  timeout -k 10 $(slot 30) python -m benchmarks.decode_latency --preset "$DECODE_AUTOTUNE" --contexts 1024 \
    --batch-sizes 1 --iters 20 --compile-mode max-autotune-no-cudagraphs > "$OUT/decode_autotune.log" 2>&1
  echo "== decode max-autotune: exit $? after $(( $(date +%s) - T0 )) s"; grep '^{' "$OUT/decode_autotune.log"
fi

if [ "${RECALL_SPEED:-0}" = 1 ]; then
  read -ra recall_cells <<< "${RECALL_CELLS:-}"
  rs=$(slot 30); [ "$rs" -gt 300 ] && rs=300
  timeout -k 10 "$rs" python -m benchmarks.recall_speed ${RECALL_CELLS:+--cells "${recall_cells[@]}"} \
    --budget-s $(( rs > 60 ? rs - 40 : 20 )) --out "$OUT" > "$OUT/recall_speed.log" 2>&1
  echo "== recall_speed: exit $? after $(( $(date +%s) - T0 )) s"; grep -E "^\||FAILED" "$OUT/recall_speed.log"
fi

if [ "${S4D_BILINEAR:-0}" = 1 ]; then
  timeout -k 10 150 python -m benchmarks.s4d_bilinear_ops --quick --budget-s 130 --out "$OUT" > "$OUT/s4d_bilinear.log" 2>&1
  echo "== s4d_bilinear_ops --quick: exit $? after $(( $(date +%s) - T0 )) s"
  grep -E "PASS|FAIL|^\|" "$OUT/s4d_bilinear.log" | tail -30
fi

if [ "${INTERDOMAIN_REAL:-0}" = 1 ]; then
  timeout -k 10 150 python -m benchmarks.interdomain_ops --real-passes --budget-s 130 > "$OUT/interdomain_real.log" 2>&1
  echo "== interdomain_ops --real-passes: exit $? after $(( $(date +%s) - T0 )) s"
  grep -E "^real_passes|PASS|FAIL|^\|" "$OUT/interdomain_real.log" | tail -30
fi

if [ "${CAUSAL_CONV:-0}" = 1 ]; then
  timeout -k 10 "$(slot 30)" python -m benchmarks.causal_conv --sweep --budget-s 400 --out "$OUT" > "$OUT/causal_conv.log" 2>&1
  echo "== causal_conv --sweep: exit $? after $(( $(date +%s) - T0 )) s"
  grep -vE "^\[|^$" "$OUT/causal_conv.log" | tail -60
fi

if [ "${DECODE_ATTN_SWEEP:-0}" = 1 ]; then
  timeout -k 10 200 python -m benchmarks.decode_attention_ops --budget-s 180 --out "$OUT" > "$OUT/decode_attention_ops.log" 2>&1
  echo "== decode_attention_ops: exit $? after $(( $(date +%s) - T0 )) s"; grep -E "^\||FAIL" "$OUT/decode_attention_ops.log" | tail -40
fi

if [ -n "${PROFILE_PREFILL:-}" ]; then
  read -ra profile_prefill <<< "$PROFILE_PREFILL"
  pp=$(slot 30); [ "$pp" -gt 240 ] && pp=240
  timeout -k 10 "$pp" python -m benchmarks.profile_prefill --models "${profile_prefill[@]}" \
    > "$OUT/profile_prefill.log" 2>&1
  echo "== profile_prefill: exit $? after $(( $(date +%s) - T0 )) s"; grep -E "^###|^\| " "$OUT/profile_prefill.log"
fi

if [ -n "${PREFILL_MODELS:-}" ]; then
  pf=$(slot 30); [ "${NATSL_OPS:-0}${NATSL_SWEEP:-0}" != 00 ] && pf=$(( pf / 2 ))  # leave the op part half
  [ "$pf" -gt 1 ] || pf=1
  timeout -k 10 "$pf" python -m benchmarks.models --sections prefill --prefill-models "$PREFILL_MODELS" \
    --prefill-lengths "${PREFILL_LENGTHS:-131072}" $([ "${PREFILL_COMPILE:-0}" = 1 ] && echo --prefill-compile) \
    --budget-s $(( pf > 40 ? pf - 20 : 20 )) --out "$OUT" > "$OUT/prefill.log" 2>&1
  echo "== prefill: exit $? after $(( $(date +%s) - T0 )) s"; grep -E "^prefill|target|^\|" "$OUT/prefill.log" | tail -20
fi
if [ "${NATSL_OPS:-0}" = 1 ] || [ "${NATSL_SWEEP:-0}" = 1 ]; then
  mode=--sweep-only
  [ "${NATSL_OPS:-0}" = 1 ] && mode=$([ "${NATSL_SWEEP:-0}" = 1 ] && echo --sweep)
  sweep_t=$(( $(left) - 10 ))
  [ -n "${DECODE_MODELS:-}" ] && sweep_t=$(( sweep_t / 2 ))  # leave the decode part half of what is left
  [ "$sweep_t" -gt 30 ] || sweep_t=30
  from=0
  while :; do  # exit code 3: a sweep job broke the CUDA context; resume at the next job in a fresh process
    timeout -k 10 "$sweep_t" python -m benchmarks.natsl_ops $mode --sweep-from "$from" \
      --sweep-kinds "${NATSL_SWEEP_KINDS:-softmax,fla_gdn,gdn}" \
      --budget-s $(( sweep_t - 20 )) --out "$OUT" >> "$OUT/natsl_sweep.log" 2>&1
    rc=$?
    echo "== natsl_ops ${mode:-(checks + timings)} --sweep-from $from: exit $rc after $(( $(date +%s) - T0 )) s"
    [ "$rc" = 3 ] || break
    from=$(grep -o 'resume with --sweep-from [0-9]*' "$OUT/natsl_sweep.log" | tail -n 1 | awk '{print $NF}')
    mode=--sweep-only  # the checks and timings ran in the first process
    sweep_t=$(( $(left) - 10 )); [ -n "${DECODE_MODELS:-}" ] && sweep_t=$(( sweep_t / 2 ))
    [ "$sweep_t" -gt 40 ] || break
  done
  grep -E "sweep|FAIL|^ +[0-9]+ \||^\|" "$OUT/natsl_sweep.log" | tail -60
fi

t=$(( $(left) - 10 ))
if [ "$t" -gt 60 ] && [ "${DECODE_MODELS-x}" != "" ]; then
  timeout -k 10 "$t" python -m benchmarks.models --sections decode --budget-s $(( t - 20 )) \
    --decode-models "${DECODE_MODELS:-natsl-hybrid-340m,gdn-340m,transformer-340m,interdomain-1.3b}" \
    --decode-contexts "${DECODE_CONTEXTS:-1024,131072}" ${DECODE_BATCHES:+--decode-batch-sizes "$DECODE_BATCHES"} \
    --out "$OUT" > "$OUT/decode.log" 2>&1
  echo "== decode: exit $? after $(( $(date +%s) - T0 )) s"; grep -vE "Warning|warn|online softmax|Online softmax|split the reduction|important use case|^softmax.$|^$" "$OUT/decode.log" | tail -n 30
fi
echo "total $(( $(date +%s) - T0 )) s"
