#!/usr/bin/env bash
# The fourth call on the lent H100: op profiles of every measured job's shapes (the first call profiled four),
# into a copy of data/ground-truth/h100/profile.db; lands in $OUT/profile.db.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
O=${OUT:-/tmp/gpu-out}; cp data/ground-truth/h100/profile.db "$O/profile.db"
grep -hv '^#' scripts/gpu/h100_jobs.txt scripts/gpu/jobs-2.txt | grep . | sort -u | while read -r model seq mb prec rc; do
  [ "$rc" = full ] && continue
  [ "$SECONDS" -gt "${BUDGET_S:-190}" ] && { echo "out of time before $model $seq $mb $prec"; break; }
  timeout 60 python3 -m trainsim profile --model "$model" --seq-len "$seq" --micro-batch "$mb" --precision "$prec" \
    --device cuda --device-name h100-sxm5-80gb --db "$O/profile.db" --no-collectives --repeats 10 2>&1 | grep -E "op signatures|error" | head -2
done
echo "done in $SECONDS s"
