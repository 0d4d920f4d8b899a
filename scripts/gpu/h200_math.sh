#!/usr/bin/env bash
# One call on a lent H200: the attention core fused against unfused (scripts/gpu/math_attention.py), then
# single-GPU training steps of GPT shapes with torch SDPA and with Megatron's unfused attention
# (scripts/gpu/h200_math_jobs.txt through probe.py), and the kernels of one step of each (math_profile.py). Packed into $OUT/h200m.tar.gz. Needs .whl (pydantic).
set -u
source scripts/gpu/env.sh
O=${OUT:-/tmp/gpu-out}; W=$O/h200m; mkdir -p "$W"
record_machine "$W"
timeout 100 python3 scripts/gpu/math_attention.py --out "$W/math_attention.json" > "$W/kernels.log" 2>&1
echo "kernels rc=$?"; cut -c1-220 "$W/kernels.log" | tail -16
timeout 120 python3 scripts/gpu/math_profile.py --out "$W/math_profile.json" > "$W/profile.log" 2>&1
echo "profile rc=$?"; grep -v Warn "$W/profile.log" | cut -c1-160 | head -45
pack() { tar -czf "$O/h200m.tar.gz" -C "$W" .; }
pack
timeout 300 python3 scripts/gpu/probe.py scripts/gpu/h200_math_jobs.txt "$W" --cluster dgx-h200 \
  --iterations 10 --warmup 3 --budget-s 270 > "$W/probe.log" 2>&1
echo "probe rc=$?"; grep '^probe:' "$W/probe.log" | cut -c1-200; grep -i "error\|Traceback" "$W/probe.log" | head -5
pack
echo "done in $SECONDS s"
