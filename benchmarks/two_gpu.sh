#!/usr/bin/env bash
# The two-GPU (NCCL) distributed-training check (<= 10 minutes on 2 H200s of one host; LIMIT caps it), from the
# repository root:
#   OUT=/some/dir LIMIT=560 bash benchmarks/two_gpu.sh
# and its CPU rehearsal (gloo, `tiny`, a few steps; what tests/bench/test_two_gpu_cpu.py runs):
#   CPU=1 OUT=/some/dir bash benchmarks/two_gpu.sh
# Every file it writes goes under $OUT.
# For every model of MODELS, at the same global batch and seed (configs/two_gpu.yaml: 50 steps, bf16 autocast over
# fp32 weights, eager, byte tokenizer, a record per step):
#   one    one process on GPU 0 (python -m hybrid_attention.cli train ...): the reference
#   ddp    torchrun --nproc-per-node 2 (python -m torch.distributed.run), train.parallel=ddp, NCCL
#   fsdp2  the same with train.parallel=fsdp2, a checkpoint at step RESUME_AT (written from the sharded model)
#   resume for RESUME_MODELS: one process resumed from fsdp2's step-RESUME_AT checkpoint (2 -> 1), to the last step
# then benchmarks.dist_compare prints one table: per-step loss differences against the reference (max abs / rel,
# PASS/FAIL at RTOL), tokens/s and the scaling (gate MIN_SCALING for SCALING_MODELS), the resume's next-step loss
# difference (RESUME_RTOL). Exit status: dist_compare's (0 pass, 1 fail).
# Environment (defaults in brackets; CPU=1 changes the defaults marked *):
#   MODELS*   items "preset/layers/BxL" [transformer-340m/softmax/8x4096 small/interdomain/16x2048]  (CPU: tiny/...)
#   STEPS* [50]  RESUME_AT* [25]  RESUME_MODELS* [the first model]  SCALING_MODELS [the models named *-340m*]
#   PARALLEL [ddp fsdp2] (the 2-process runs; the resume needs fsdp2)  SKIP_STEPS* [5] (left out of tokens/s)
#   RTOL [1e-2]  RESUME_RTOL [1e-3]  MIN_SCALING [1.8; CPU: none]  LIMIT [560 s]  RUNS [/tmp/two_gpu]
#   EXTRA     more config overrides for every run ("key=value key=value")   PYTHON [python]
# NVLink multicast stays off in every process: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
# NVSHMEM_DISABLE_NVLS=1 are exported here (and checked in both torchrun workers, $OUT/env_check.log).
# $OUT gets (flat): versions.txt, commands.txt (every command with its wall time and exit status), <model>_<run>.log,
# <model>_<run>_metrics.jsonl, <model>_<run>_config.yaml, per_step.txt, table.md, dist_compare.json.
# Sizing (estimates, not yet measured on 2 GPUs): the global batch is 32K tokens for both models, so the per-device
# half (16K) keeps the GEMMs large next to the gradient all-reduce (DDP: 1.2 GB of fp32 gradients, ≈ 4 ms over NVLink
# and overlapped with the backward; FSDP2: all-gathers and reduce-scatters of the same size) and the scaling gate
# measures the parallel speed-up, not start-up or communication latency. benchmarks/NOTES.md's training-step table
# (eager, bf16, one H200): transformer-340m 184 ms per 4 x 4096 (32 GB peak), so 8 x 4096 ≈ 370 ms on one GPU
# (≈ 60 GB) and ≈ 190 ms on each of two (here with the 259-token byte vocabulary, 309M parameters, a little less);
# small (interdomain x6) 95 ms per 16 x 2048. 50 steps: ≈ 20 s, 10 s, 5 s of training per run. Fixed costs per
# run: ≈ 15-25 s of start-up (imports, CUDA/NCCL init, the 309M-parameter init on the CPU: 3 s here) and per 340M
# checkpoint (3.5 GB: fp32 weights + AdamW moments + sha256 manifest) 16 s on this project's 2-core CPU machine.
# 340M: one ≈ 55 s, ddp ≈ 45 s, fsdp2 (two checkpoints) ≈ 60 s, resume (reads + verifies one) ≈ 50 s; small: three
# runs ≈ 75 s: ≈ 5 minutes in all, the 340M model first. gdn-340m instead (MODELS=gdn-340m/gdn/8x4096): 302 ms per
# 4 x 4096 and 49 GB peak, so ≈ 30 s of training per one-GPU run and ≈ 95 GB.
# Every run starts under `timeout` of the time left; one that would start with < 40 s left is skipped (and its rows
# FAIL as missing). Checkpoints are deleted once a run is done (except fsdp2's step RESUME_AT until the resume ran).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-.}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
LIMIT=${LIMIT:-560}
RUNS=${RUNS:-/tmp/two_gpu}
PY=${PYTHON:-python}
CPU=${CPU:-0}
T0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
mkdir -p "$OUT"
if [ "$CPU" = 1 ]; then
  export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
  MODELS=${MODELS:-tiny/interdomain/8x64}
  STEPS=${STEPS:-4}
  RESUME_AT=${RESUME_AT:-2}
  MIN_SCALING=${MIN_SCALING:-}
  SKIP_STEPS=${SKIP_STEPS:-1}
  BASE="train.device=cpu data.max_bytes=400000 data.val_fraction=0.2 data.val_tokens=1024 optim.warmup_steps=2"
else
  MODELS=${MODELS:-transformer-340m/softmax/8x4096 small/interdomain/16x2048}
  STEPS=${STEPS:-50}
  RESUME_AT=${RESUME_AT:-25}
  MIN_SCALING=${MIN_SCALING-1.8}
  SKIP_STEPS=${SKIP_STEPS:-5}
  BASE="train.device=cuda"
fi
PARALLEL=${PARALLEL:-ddp fsdp2}
read -ra models <<< "$MODELS"
read -ra parallel <<< "$PARALLEL"
names=()
for m in "${models[@]}"; do names+=("${m%%/*}"); done
RESUME_MODELS=${RESUME_MODELS-${names[0]}}
if [ -z "${SCALING_MODELS+x}" ]; then
  SCALING_MODELS=""
  for n in "${names[@]}"; do case "$n" in *340m*) SCALING_MODELS="$SCALING_MODELS $n" ;; esac; done
fi
if [ "$CPU" != 1 ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -lt 2 ]; then
  echo "error: CPU=$CPU: this check needs 2 visible GPUs (nvidia-smi -L lists fewer); CPU=1 runs the gloo rehearsal" >&2
  exit 2
fi
if [ "$RESUME_AT" -ge "$STEPS" ] || [ "$RESUME_AT" -lt 1 ]; then
  echo "error: RESUME_AT=$RESUME_AT must be in [1, STEPS=$STEPS)" >&2; exit 2
fi

{
  date -u
  echo "git $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    || echo "no nvidia-smi"
  nvidia-smi topo -m 2>/dev/null | head -4
  $PY -c "import sys, torch; c = torch.cuda.is_available(); print('python', sys.version.split()[0], '| torch',
torch.__version__, '| cuda', torch.version.cuda, '| nccl', '.'.join(map(str, torch.cuda.nccl.version())) if c else '-',
'| gpus', torch.cuda.device_count()); import transformers; print('transformers', transformers.__version__)"
  env | grep -E '^(NCCL_|TORCH_SYMM|NVSHMEM_|OMP_NUM)' | sort
  echo "MODELS=$MODELS PARALLEL=$PARALLEL STEPS=$STEPS RESUME_AT=$RESUME_AT RESUME_MODELS=$RESUME_MODELS"
  echo "SCALING_MODELS=$SCALING_MODELS SKIP_STEPS=$SKIP_STEPS"
  echo "RTOL=${RTOL:-1e-2} RESUME_RTOL=${RESUME_RTOL:-1e-3} MIN_SCALING=${MIN_SCALING:-none} LIMIT=$LIMIT EXTRA=${EXTRA:-}"
} > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
# every torchrun worker sees the three variables (no Python start-up: a few seconds)
$PY -m torch.distributed.run --nproc-per-node 2 --no-python bash -c 'echo "rank $RANK of $WORLD_SIZE:" \
  $(env | grep -E "^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)=" | sort)' \
  > "$OUT/env_check.log" 2>&1
echo "env check: exit $?"; grep '^rank' "$OUT/env_check.log"

: > "$OUT/commands.txt"
# go NAME RUN CMD...: run CMD under the time left, log to $OUT/NAME_RUN.log, record it in commands.txt
go() {
  local name=$1 run=$2 t rc s
  shift 2
  t=$(( $(left) - 10 ))
  if [ "$t" -lt 40 ]; then
    echo "skipped (only $(left) s left): $name $run" | tee -a "$OUT/commands.txt"; return 1
  fi
  s=$(date +%s)
  timeout "$t" "$@" > "$OUT/${name}_${run}.log" 2>&1
  rc=$?
  printf '%s %s: exit %d after %d s (%d s into the call): %s\n' "$name" "$run" "$rc" $(( $(date +%s) - s )) \
    $(( $(date +%s) - T0 )) "$*" | tee -a "$OUT/commands.txt"
  tail -n 2 "$OUT/${name}_${run}.log"
  return $rc
}

TRAIN="-m hybrid_attention.cli train configs/two_gpu.yaml"
TORCHRUN="$PY -m torch.distributed.run --nproc-per-node 2"
for i in "${!models[@]}"; do
  IFS=/ read -r preset layers shape <<< "${models[$i]}"
  name=${names[$i]}
  bsz=${shape%x*}; len=${shape#*x}
  dir=$RUNS/$name
  rm -rf "$dir"; mkdir -p "$dir"
  read -ra common <<< "$BASE model.preset=$preset model.layers=$layers train.batch_size=$bsz data.seq_len=$len \
train.steps=$STEPS ${EXTRA:-}"
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-0} go "$name" one $PY $TRAIN "${common[@]}" train.out_dir="$dir/one"
  rm -rf "$dir/one/checkpoints"
  case " $PARALLEL " in *" ddp "*)
    go "$name" ddp $TORCHRUN $TRAIN "${common[@]}" train.parallel=ddp train.out_dir="$dir/ddp"
    rm -rf "$dir/ddp/checkpoints" ;;
  esac
  case " $PARALLEL " in *" fsdp2 "*)
    go "$name" fsdp2 $TORCHRUN $TRAIN "${common[@]}" train.parallel=fsdp2 train.checkpoint_every="$RESUME_AT" \
      train.out_dir="$dir/fsdp2" ;;
  esac
  ck=$(printf 'step-%08d' "$RESUME_AT")
  find "$dir/fsdp2/checkpoints" -mindepth 1 -maxdepth 1 ! -name "$ck" -exec rm -rf {} + 2>/dev/null
  case " $RESUME_MODELS " in *" $name "*)
    if [ -d "$dir/fsdp2/checkpoints/$ck" ]; then
      # the run folder without metrics.jsonl (so the resumed run logs only the steps after RESUME_AT) and with only
      # the step-RESUME_AT checkpoint (hard links: nothing is copied, the resumed run writes new files)
      mkdir -p "$dir/resume/checkpoints"
      cp -r "$dir/fsdp2/tokenizer" "$dir/fsdp2/config.yaml" "$dir/resume/"
      cp -al "$dir/fsdp2/checkpoints/$ck" "$dir/resume/checkpoints/"
      CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-0} go "$name" resume $PY $TRAIN "${common[@]}" \
        train.parallel=fsdp2 train.out_dir="$dir/resume" --resume
      grep -h "resumed from" "$OUT/${name}_resume.log"
    else
      echo "no $dir/fsdp2/checkpoints/$ck: resume of $name not run" | tee -a "$OUT/commands.txt"
    fi
    rm -rf "$dir/resume/checkpoints" "$dir/fsdp2/checkpoints" ;;
  esac
  for run in one ddp fsdp2 resume; do
    [ -f "$dir/$run/metrics.jsonl" ] && cp "$dir/$run/metrics.jsonl" "$OUT/${name}_${run}_metrics.jsonl"
    [ -f "$dir/$run/config.yaml" ] && cp "$dir/$run/config.yaml" "$OUT/${name}_${run}_config.yaml"
  done
done

args=("$RUNS" --models "${names[@]}" --runs "${parallel[@]}" --skip-steps "$SKIP_STEPS" --rtol "${RTOL:-1e-2}"
      --resume-rtol "${RESUME_RTOL:-1e-3}" --json "$OUT/dist_compare.json" --markdown "$OUT/table.md")
[ -n "$MIN_SCALING" ] && [ -n "${SCALING_MODELS// /}" ] && {
  read -ra sm <<< "$SCALING_MODELS"; args+=(--min-scaling "$MIN_SCALING" --scaling-models "${sm[@]}"); }
[ -n "${RESUME_MODELS// /}" ] && { read -ra rm_ <<< "$RESUME_MODELS"; args+=(--resume-models "${rm_[@]}"); }
$PY -m benchmarks.dist_compare "${args[@]}" --per-step > "$OUT/per_step.txt" 2>&1
$PY -m benchmarks.dist_compare "${args[@]}"
rc=$?
echo "total $(( $(date +%s) - T0 )) s"
exit $rc
