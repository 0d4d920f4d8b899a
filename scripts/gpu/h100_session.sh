#!/usr/bin/env bash
# One lent H100, one call (docs/measure.md "GPU ground truth"): training steps + out-of-memory probes
# (probe.py), every stage of two models for PredTOP/MPE (stages_gpu.py), EmbeddingBag microbenchmarks
# (trainsim profile-embedding --device cuda) and op profiles (trainsim profile --device cuda), each part under
# its own time limit; everything lands in $OUT/h100.tar.gz, re-packed after each part.
set -u
source scripts/gpu/env.sh
O=${OUT:-/tmp/gpu-out}; W=$O/h100; mkdir -p "$W"
pack() { tar -czf "$O/h100.tar.gz" -C "$W" . ; echo "== packed at $SECONDS s"; }
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
} > "$W/machine.txt" 2>&1
cat "$W/machine.txt"
echo "== steps"
timeout 150 python3 scripts/gpu/probe.py scripts/gpu/h100_jobs.txt "$W/steps" --cluster dgx-h100-80gb \
  --iterations 10 --warmup 3 --budget-s 120 > "$W/steps.log" 2>&1; echo "rc=$?"; grep '^probe' "$W/steps.log" | cut -c1-200
pack
echo "== oom probes"
timeout 150 python3 scripts/gpu/probe.py scripts/gpu/h100_oom_jobs.txt "$W/oom" --cluster dgx-h100-80gb \
  --iterations 2 --warmup 1 --budget-s 120 > "$W/oom.log" 2>&1; echo "rc=$?"; grep '^probe' "$W/oom.log" | cut -c1-120
pack
echo "== stages"
timeout 150 python3 scripts/gpu/stages_gpu.py --db "$W/stages_gpu.db" --budget-s 120 > "$W/stages.log" 2>&1
echo "rc=$?"; tail -3 "$W/stages.log"
pack
echo "== embedding"
timeout 130 python3 -m trainsim profile-embedding --device cuda --csv "$W/embedding_gpu.csv" --count 200 \
  --repeats 10 > "$W/embedding.log" 2>&1; echo "rc=$?"; tail -2 "$W/embedding.log"
pack
echo "== op profiles"
for job in "gpt3-1.3b 2048 4 amp-bf16" "llama3.2-1b 2048 4 amp-bf16" "gpt3-350m 1024 8 tf32" "gpt3-125m 1024 8 amp-bf16"; do
  read -r model seq mb prec <<<"$job"
  [ "$SECONDS" -gt "${BUDGET_S:-470}" ] && { echo "out of time: profiles stop here"; break; }
  timeout 80 python3 -m trainsim profile --model "$model" --seq-len "$seq" --micro-batch "$mb" --precision "$prec" \
    --device cuda --device-name h100-sxm5-80gb --db "$W/h100.db" --no-collectives --repeats 10 >> "$W/profile.log" 2>&1
  echo "profile $model rc=$?"
done
pack
echo "done in $SECONDS s"
