#!/usr/bin/env bash
# The third call on the lent H100: every stage of the two models again, now that stage measurement no longer
# leaks each stage's forward activations (the second call's run filled the GPU after ~25 stages). $OUT/h100c.tar.gz.
set -u
source scripts/gpu/env.sh
O=${OUT:-/tmp/gpu-out}; W=$O/h100c; mkdir -p "$W"
timeout 280 python3 scripts/gpu/stages_gpu.py --db "$W/stages_gpu.db" --budget-s 260 > "$W/stages.log" 2>&1
echo "rc=$?"; grep -v "^ " "$W/stages.log" | tail -25
tar -czf "$O/h100c.tar.gz" -C "$W" .
echo "done in $SECONDS s"
