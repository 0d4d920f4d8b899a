#!/usr/bin/env bash
# One call on a lent H200: single-GPU training steps of 16-bit models with fp32 main parameters (bf16, the way
# Megatron and FSDP2 hold their weights) beside autocast twins (scripts/gpu/h200_bf16_jobs.txt through probe.py),
# then one long run with nvidia-smi sampled every 0.5 s (does a step slow down at the power cap?); SUSTAINED=0
# skips the long run.
# Packed into $OUT/h200b.tar.gz. Needs .whl (pydantic).
set -u
source scripts/gpu/env.sh
O=${OUT:-/tmp/gpu-out}; W=$O/h200b; mkdir -p "$W"
record_machine "$W"
pack() { tar -czf "$O/h200b.tar.gz" -C "$W" .; }
timeout 330 python3 scripts/gpu/probe.py scripts/gpu/h200_bf16_jobs.txt "$W/steps" --cluster dgx-h200 \
  --iterations 10 --warmup 3 --budget-s 300 > "$W/probe.log" 2>&1
echo "probe rc=$?"; grep '^probe:' "$W/probe.log" | cut -c1-90; grep -i "error\|Traceback" "$W/probe.log" | head -5
for f in "$W"/steps/measured/*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['run_id'], round(d['iteration_time_s']['median_s']*1e3,2), 'ms')" "$f"; done
pack
[ "${SUSTAINED:-1}" = 1 ] || { echo "done in $SECONDS s (SUSTAINED=0: no long run)"; exit 0; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 500 > "$W/smi.csv" 2>&1 &
SMI=$!
timeout 120 python3 scripts/gpu/probe.py scripts/gpu/sustained_job.txt "$W/sustained" --cluster dgx-h200 \
  --iterations 150 --warmup 3 --budget-s 100 > "$W/sustained.log" 2>&1
echo "sustained rc=$?"
kill $SMI
python3 - "$W" <<'PY'
import json, sys, glob, statistics as st
for f in glob.glob(sys.argv[1] + "/sustained/measured/*.json"):
    t = json.load(open(f))["iteration_times_s"]
    print("sustained", len(t), "first 10 median", round(st.median(t[:10]) * 1e3, 2), "ms; last 50 median",
          round(st.median(t[-50:]) * 1e3, 2), "ms")
PY
tail -3 "$W/smi.csv"
pack
echo "done in $SECONDS s"
