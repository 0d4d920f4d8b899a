#!/usr/bin/env bash
# The second call on the lent H100: every stage of the two models (the first call's stage run ran out of
# memory after 36 stages: the stage modules' reference cycles were not collected between stages), a second
# EmbeddingBag sample (seed 1), and the H200's second job set as training steps. Lands in $OUT/h100b.tar.gz.
set -u
source scripts/gpu/env.sh
O=${OUT:-/tmp/gpu-out}; W=$O/h100b; mkdir -p "$W"
pack() { tar -czf "$O/h100b.tar.gz" -C "$W" . ; echo "== packed at $SECONDS s"; }
echo "== stages"
timeout 230 python3 scripts/gpu/stages_gpu.py --db "$W/stages_gpu.db" --budget-s 210 > "$W/stages.log" 2>&1
echo "rc=$?"; grep -v "^ " "$W/stages.log" | tail -20
pack
echo "== embedding (seed 1)"
timeout 100 python3 -m trainsim profile-embedding --device cuda --csv "$W/embedding_gpu_seed1.csv" --count 300 \
  --seed 1 --repeats 10 > "$W/embedding.log" 2>&1; echo "rc=$?"; tail -1 "$W/embedding.log"
pack
echo "== steps (second set)"
timeout 120 python3 scripts/gpu/probe.py scripts/gpu/jobs-2.txt "$W/steps2" --cluster dgx-h100-80gb \
  --iterations 10 --warmup 3 --budget-s 100 > "$W/steps2.log" 2>&1; echo "rc=$?"; grep '^probe' "$W/steps2.log" | cut -c1-90
pack
echo "done in $SECONDS s"
