#!/usr/bin/env bash
# Second call on the lent H200 (after h200_bf16.sh): more bf16 steps (h200_bf16_jobs2.txt) and the kernel
# profiles of four bf16 steps (step_kernels.py, h200_bf16_kernels.txt). Packed into $OUT/h200b2.tar.gz.
set -u
source scripts/gpu/env.sh
O=${OUT:-/tmp/gpu-out}; W=$O/h200b2; mkdir -p "$W"
pack() { tar -czf "$O/h200b2.tar.gz" -C "$W" .; }
timeout 200 python3 scripts/gpu/probe.py scripts/gpu/h200_bf16_jobs2.txt "$W/steps" --cluster dgx-h200 \
  --iterations 10 --warmup 3 --budget-s 170 > "$W/probe.log" 2>&1
echo "probe rc=$?"; grep '^probe:' "$W/probe.log" | grep -v '"fits"' | cut -c1-400; grep -i "Traceback" -A3 "$W/probe.log" | head
for f in "$W"/steps/measured/*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['run_id'], round(d['iteration_time_s']['median_s']*1e3,2), 'ms')" "$f"; done
pack
timeout 150 python3 scripts/gpu/step_kernels.py scripts/gpu/h200_bf16_kernels.txt --out "$W/step_kernels.json" \
  > "$W/kernels.log" 2>&1
echo "kernels rc=$?"; grep -v "^\[" "$W/kernels.log" | cut -c1-300 | tail -8
pack
echo "done in $SECONDS s"
