# Sourced by the GPU session scripts: unbuffered Python, the carried wheels in .whl/ (pydantic, ... where the
# machine lacks them) installed into /tmp/site, and this checkout's src on PYTHONPATH.
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi

# record_machine DIR: the GPU, its limits and torch's build into DIR/machine.txt (and print it)
record_machine() {
  { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
  } > "$1/machine.txt" 2>&1
  cat "$1/machine.txt"
}
