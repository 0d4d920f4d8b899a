#!/usr/bin/env bash
# GPU ground truth on one lent GPU (see docs/measure.md "GPU ground truth"): single-GPU training steps measured
# with `trainsim measure`, and the op profiles of the same jobs with `trainsim profile`, packed into
# $OUT/gpu.tar.gz. Needs the wheels in .whl/ (pydantic, typer, ...) where the machine lacks them.
set -u
source scripts/gpu/env.sh
W=${OUT:-/tmp/gpu-out}/work; mkdir -p "$W/measured"
ts() { timeout "$T" python3 -m trainsim "$@"; }
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
} > "$W/machine.txt" 2>&1
cat "$W/machine.txt"
CL="--cluster dgx-h200 --num-gpus 1"
# Jobs: "model seq_len micro_batch precision recompute", one per line of the file named by $1, else these.
JOBS=(
  "gpt3-125m 1024 8 amp-bf16 none"
  "gpt3-350m 1024 8 amp-bf16 none"
  "gpt3-760m 2048 4 amp-bf16 none"
  "gpt3-1.3b 2048 4 amp-bf16 none"
  "gpt3-1.3b 2048 4 amp-bf16 full"
  "gpt3-1.3b 2048 4 tf32 none"
  "gpt3-2.7b 2048 2 amp-bf16 none"
  "llama3.2-1b 2048 4 amp-bf16 none"
)
if [ $# -ge 1 ]; then mapfile -t JOBS < <(grep -v '^#' "$1" | grep .); fi
for job in "${JOBS[@]}"; do
  read -r model seq mb prec rc <<<"$job"
  id="$model-s$seq-mb$mb-$prec-rc$rc"
  echo "== measure $id"
  T=120 ts measure --model "$model" $CL --seq-len "$seq" --micro-batch "$mb" --global-batch "$mb" \
    --precision "$prec" --recompute "$rc" --iterations 20 --warmup 5 --timeout-s 100 \
    --out "$W/measured" --run-id "$id" 2>&1 | tail -3
done
pack() { tar -czf "${OUT:-/tmp/gpu-out}/gpu.tar.gz" -C "$W" .; }
pack
for job in "${JOBS[@]}"; do
  read -r model seq mb prec rc <<<"$job"
  [ "$rc" = full ] && continue
  [ "$SECONDS" -gt "${BUDGET_S:-380}" ] && { echo "== out of time: profiles stop here"; break; }
  echo "== profile $model $seq $mb $prec"
  T=90 ts profile --model "$model" --seq-len "$seq" --micro-batch "$mb" --precision "$prec" --device cuda \
    --device-name h200-sxm-141gb --db "$W/h200.db" --no-collectives --repeats 10 2>&1 | tail -2
done
pack
echo "done in $SECONDS s"
