"""A CPU rank's resident runtime, measured through the measure harness itself (catalog/runtime_memory.py).

`trainsim measure` on `world_size` gloo ranks trains a transformer of negligible size (one layer of 16, a
vocabulary of 64: under 0.1 MiB of weights, gradients and Adam states) under an unreachable memory cap, so each
rank samples its resident memory while the steps run, as it does under a real cap (measure/worker.py). Per rank:

- baseline_bytes: the resident memory after torch is imported and the gloo group joined, before the model is
  built (what the harness leaves out of its cap; the interpreter, torch and gloo libraries);
- runtime_bytes: the peak above that baseline while the steps run (the harness' code and graph, the model's
  construction, the oneDNN and autograd working set, gloo's buffers), less the model's own bytes.

The largest rank's figures are kept (a cap binds on the largest rank).
"""

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trainsim.errors import ConfigError, TrainsimError

if TYPE_CHECKING:
    from trainsim.job import Job
    from trainsim.measure.results import MeasuredRun

NEGLIGIBLE_MODEL = {"kind": "transformer", "name": "runtime-probe", "description": "negligible model",
                    "arch": "gpt", "num_layers": 1, "hidden": 16, "num_heads": 2, "ffn_hidden": 64, "vocab": 64,
                    "max_seq_len": 16}
_SEQ_LEN = 16
_UNREACHABLE_CAP_BYTES = 2**40  # the cap only switches the harness' resident-memory sampling on


@dataclass(frozen=True, slots=True)
class RuntimeMemory:
    baseline_bytes: int  # largest rank's resident memory before the model is built
    runtime_bytes: int  # largest rank's peak above its baseline, less the model's own bytes
    model_bytes: int  # the negligible model's weights, gradients and Adam states (fp32)
    world_size: int
    iterations: int


def run_negligible(model: dict[str, Any], *, world_size: int, iterations: int, warmup: int, seq_len: int,
                   run_id: str, timeout_s: float, memory_cap_bytes: int = 0,
                   phase_probe: bool = False) -> tuple["Job", "MeasuredRun"]:
    """Train a negligible model data-parallel on `world_size` local gloo ranks through `trainsim measure --tree`
    (the split executor, one micro-batch a step, fp32, the optimizer's loop) and read its run back: the probes of
    a runtime's own memory and of the executor's own cost per op."""
    from trainsim.jobfile import job_from_settings
    from trainsim.measure.launch import launch, make_spec
    from trainsim.measure.results import load_run

    if world_size < 2:
        raise ConfigError("world_size", world_size, "must be at least 2 (a gloo group with a peer)")
    if iterations < 1:
        raise ConfigError("iterations", iterations, "must be a positive integer")
    with tempfile.TemporaryDirectory(prefix=f"trainsim-{run_id}-") as folder:
        out = Path(folder)
        model_file = out / "probe.yaml"
        model_file.write_text(yaml.safe_dump(model, sort_keys=False))
        job = job_from_settings({"model": str(model_file), "cluster": "local-cpu", "num_gpus": world_size,
                                 "dp": world_size, "micro_batch": 1, "global_batch": world_size,
                                 "seq_len": seq_len, "precision": "fp32", "optimizer_impl": "loop"})
        job = replace(job, cluster=job.cluster.on_one_node())
        spec = make_spec(job, out, run_id=run_id, iterations=iterations, warmup=warmup, timeout_s=timeout_s,
                         threads=1, device="cpu", tree_yaml="strategy_tree:\n  schedule: {micro_batches: 1}\n",
                         memory_cap_bytes=memory_cap_bytes, op_configs={}, phase_probe=phase_probe)
        return job, load_run(launch(spec, world_size))


def measure_runtime_memory(world_size: int = 2, iterations: int = 3, timeout_s: float = 300.0) -> RuntimeMemory:
    """Run the negligible model through `trainsim measure` on `world_size` local gloo ranks."""
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.strategy.device_slice import DeviceSlice

    job, run = run_negligible(NEGLIGIBLE_MODEL, world_size=world_size, iterations=iterations, warmup=1,
                              seq_len=_SEQ_LEN, run_id="runtime-memory", timeout_s=timeout_s,
                              memory_cap_bytes=_UNREACHABLE_CAP_BYTES)
    used = [p for p in run.settings.get("capped_peak_bytes", []) if isinstance(p, int | float)]
    if not used or not run.baseline_memory_bytes:
        raise TrainsimError("the runtime-memory run recorded no resident memory (is /proc/self/statm readable?)")
    graph = build_graph(job.model, DeviceSlice.of(job.parallel))
    # fp32 weights, gradients and Adam's two moments
    model_bytes = int(4 * 4 * sum(layer.count * layer.param_count for layer in graph.layers))
    return RuntimeMemory(int(max(run.baseline_memory_bytes)), max(0, int(max(used)) - model_bytes), model_bytes,
                         world_size, iterations)
