#!/usr/bin/env bash
# One lent GPU, one call (docs/recommendation.md "Embedding-lookup model"): EmbeddingBag microbenchmarks timed
# as their kernels' own durations (`trainsim profile-embedding --device cuda --timing kernel`), two passes over
# the same 300 benchmarks (the pass-to-pass spread is the floor of the lookup model's error), after a short
# check of both timings on the same six benchmarks. Rows are written as they come (<csv>.partial), so a pass cut
# short by its time limit keeps what it measured. Needs the wheels in .whl/ (pydantic) where the machine lacks them.
set -u
source scripts/gpu/env.sh
O=${OUT:-/tmp/gpu-out}; mkdir -p "$O"
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
} > "$O/machine.txt" 2>&1
cat "$O/machine.txt"
pe() { timeout "$1" python3 -m trainsim profile-embedding --device cuda "${@:2}" 2>&1 | grep -v USDT | tail -4; echo "rc=${PIPESTATUS[0]} at $SECONDS s"; }
echo "== check: kernel and events timings of the same six benchmarks"
pe 60 --timing kernel --csv "$O/check_kernel.csv" --count 6 --seed 9 --repeats 3
pe 60 --timing events --csv "$O/check_events.csv" --count 6 --seed 9 --repeats 3
echo "== pass a"
pe "${PASS_S:-150}" --timing kernel --csv "$O/kernel_seed2_a.csv" --count "${COUNT:-300}" --seed 2 --repeats 5
echo "== pass b"
pe "${PASS_S:-150}" --timing kernel --csv "$O/kernel_seed2_b.csv" --count "${COUNT:-300}" --seed 2 --repeats 5
echo "done in $SECONDS s"
