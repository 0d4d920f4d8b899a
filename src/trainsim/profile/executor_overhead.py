"""The split executor's own cost per op, measured through the measure harness itself (as profile/runtime_memory.py
measures a rank's resident runtime).

`trainsim measure --tree` runs a plan's ops one by one through measure/split_model.py: per forward op it reads
its inputs' placements, checks whether a reshard is needed, calls the torch op and records the output's
placement, in Python. None of that is in the op microbenchmarks (which time the torch call) nor in the profile's
autograd overhead per op (profile.ops.measure_overhead: a chain of tiny multiplies). It is priced here from a run
of the executor on a model of negligible size of the job's family (a CNN of 2 channels on 4x4 images; the
runtime-memory probe's transformer; a DLRM of 2-wide tables), one micro-batch of 1 sample per rank, on
`world_size` gloo ranks: each rank's training-thread CPU seconds per phase (SplitTrainer.phase_cpu_s) over the
iterations, less the probe's own op kernels of that phase (the op microbenchmarks, timed warm in the same process
just before: they are priced as ops), divided by the probe graph's ops of that phase, less the autograd overhead
per op measured beside them (priced separately, per graph op).
"""

from dataclasses import dataclass
from typing import Any

from trainsim.errors import ConfigError, TrainsimError
from trainsim.profile.database import Environment, ProfileDB
from trainsim.profile.ops import OVERHEAD_SIGNATURE_KIND, OpSignature
from trainsim.profile.runtime_memory import NEGLIGIBLE_MODEL as NEGLIGIBLE_TRANSFORMER
from trainsim.profile.runtime_memory import run_negligible

EXECUTOR_IMPL = "split-executor"
EXECUTOR_PHASES = {"fwd": "forward", "bwd": "backward"}  # signature phase -> SplitTrainer.phase_cpu_s key
FAMILIES = ("cnn", "transformer", "dlrm")
_BLOCKS = 8  # the CNN probe's conv / norm / relu blocks at 4x4


def _negligible_cnn() -> dict[str, Any]:
    layer = {"kernel": [3, 3], "stride": 1, "out_hw": [4, 4]}
    layers: list[dict[str, Any]] = [{"type": "conv", "name": "conv0", "in_channels": 3, "out_channels": 2,
                                     **layer, "block": "stem"}]
    for i in range(_BLOCKS):
        if i:
            layers.append({"type": "conv", "name": f"conv{i}", "in_channels": 2, "out_channels": 2, **layer,
                           "block": f"b{i}"})
        layers += [{"type": "norm", "name": f"bn{i}", "in_channels": 2, "out_channels": 2, "out_hw": [4, 4],
                    "block": f"b{i}"},
                   {"type": "relu", "name": f"relu{i}", "in_channels": 2, "out_channels": 2, "out_hw": [4, 4],
                    "block": f"b{i}"}]
    layers += [{"type": "pool", "name": "avgpool", "in_channels": 2, "out_channels": 2, "kernel": [4, 4],
                "stride": 4, "out_hw": [1, 1], "block": "head"},
               {"type": "fc", "name": "fc", "in_channels": 2, "out_channels": 2, "block": "head"}]
    return {"kind": "cnn", "name": "executor-probe-cnn", "description": "negligible CNN", "input_hw": [4, 4],
            "layers": layers}


NEGLIGIBLE_MODELS: dict[str, dict[str, Any]] = {
    "cnn": _negligible_cnn(),
    "transformer": NEGLIGIBLE_TRANSFORMER,
    "dlrm": {"kind": "dlrm", "name": "executor-probe-dlrm", "description": "negligible DLRM", "dense_features": 2,
             "bottom_mlp": [2, 2], "top_mlp": [2, 1], "tables": [{"rows": 8, "dim": 2, "count": 2}]},
}
_SEQ_LEN = 16  # the transformer probe's (runtime_memory's)


def executor_signature(family: str, phase: str) -> OpSignature:
    """The split executor's cost per graph op of `phase` ("fwd" or "bwd") for a model family, beyond the autograd
    overhead per op."""
    return OpSignature(OVERHEAD_SIGNATURE_KIND, f"{EXECUTOR_IMPL}-{family}", phase, "fp32", (1,))


@dataclass(frozen=True, slots=True)
class ExecutorOverhead:
    family: str
    per_op_s: dict[str, list[float]]  # phase -> one figure per rank: CPU seconds per op beyond autograd's
    ops: dict[str, int]  # phase -> the probe graph's ops per micro-batch
    kernel_s: dict[str, float]  # phase -> the probe's op kernels per micro-batch (subtracted)
    autograd_per_op_s: float  # subtracted (profile.ops.measure_overhead, median)
    world_size: int
    iterations: int
    # with the reference probe around every step (trainsim measure --phase-normalise): per rank, each step's
    # training-thread CPU and the probe pairs around it, for a phase-normalised copy (proteus_table4.py)
    probed_steps: dict[str, Any] | None = None


def per_op_of(phase_cpu_s: dict[str, float], steps: int, ops: dict[str, int], kernel_s: dict[str, float],
              autograd_per_op_s: float) -> dict[str, float]:
    """Per signature phase: a rank's CPU seconds of that phase over `steps` micro-batches, less the phase's op
    kernels per micro-batch, per op, less the autograd overhead per op (at least 0)."""
    if steps < 1:
        raise ConfigError("steps", steps, "must be a positive integer")
    return {phase: max(0.0, (phase_cpu_s[key] / steps - kernel_s[phase]) / ops[phase] - autograd_per_op_s)
            for phase, key in EXECUTOR_PHASES.items()}


def probe_kernels_s(graph: Any, hints: Any, repeats: int = 5) -> dict[str, float]:
    """Per signature phase, the probe graph's op kernels of one micro-batch, each the median of `repeats` warm
    samples on this thread's CPU time (profile.ops.measure_op; ops without a microbenchmark count 0)."""
    import statistics

    from trainsim.profile.ops import measure_op, signature_of

    medians: dict[OpSignature, float] = {}
    out = dict.fromkeys(EXECUTOR_PHASES, 0.0)
    for layer in graph.layers:
        for phase, ops in (("fwd", layer.fwd), ("bwd", layer.bwd)):
            for op in ops:
                sig = signature_of(op)
                if sig is None:
                    continue
                if sig not in medians:
                    medians[sig] = statistics.median(measure_op(sig, hints, "cpu", 2, repeats, cold=False)[0])
                out[phase] += layer.count * medians[sig]
    return out


def measure_executor_overhead(family: str, world_size: int = 2, iterations: int = 20,
                              timeout_s: float = 300.0, phase_probe: bool = False) -> ExecutorOverhead:
    """Run the family's negligible model through `trainsim measure --tree` (the split executor, data-parallel) on
    `world_size` local gloo ranks (phase_probe: with `--phase-normalise`)."""
    import statistics

    from trainsim.frontends.catalog.build import build_graph
    from trainsim.profile.job import hints_for
    from trainsim.profile.ops import measure_overhead
    from trainsim.strategy.device_slice import DeviceSlice

    if family not in NEGLIGIBLE_MODELS:
        raise ConfigError("family", family, f"must be one of {', '.join(FAMILIES)}")
    job, run = run_negligible(NEGLIGIBLE_MODELS[family], world_size=world_size, iterations=iterations, warmup=2,
                              seq_len=_SEQ_LEN if family == "transformer" else 1, run_id="executor-overhead",
                              timeout_s=timeout_s, phase_probe=phase_probe)
    phases = run.settings.get("phase_thread_cpu_s_per_rank")
    if not phases:
        raise TrainsimError("the executor-overhead run recorded no CPU time per phase")
    import torch

    torch.set_num_threads(1)  # as the ranks run
    samples, _ = measure_overhead("cpu", warmup=2, repeats=5)
    autograd = statistics.median(samples)
    graph = build_graph(job.model, DeviceSlice.of(job.parallel))
    kernels = probe_kernels_s(graph, hints_for(job.model, DeviceSlice.of(job.parallel)))
    ops = {"fwd": sum(layer.count * len(layer.fwd) for layer in graph.layers),
           "bwd": sum(layer.count * len(layer.bwd) for layer in graph.layers)}
    steps = len(run.iteration_times_s)  # one micro-batch per step
    per_rank = [per_op_of(rank, steps, ops, kernels, autograd) for rank in phases]
    probed = ({key: run.settings[key] for key in ("step_thread_cpu_s_per_rank", "phase_probe_s_per_rank")}
              if phase_probe else None)
    return ExecutorOverhead(family, {phase: [r[phase] for r in per_rank] for phase in EXECUTOR_PHASES}, ops,
                            kernels, autograd, world_size, steps, probed)


def store_executor_overhead(db: ProfileDB, env: Environment, result: ExecutorOverhead) -> None:
    """One sample per rank per phase (the lookup takes their median)."""
    for phase, samples in result.per_op_s.items():
        db.add_op_samples(env, executor_signature(result.family, phase), samples,
                          f"split executor per {phase} op beyond its kernels ({result.kernel_s[phase] * 1e6:.0f} us "
                          f"per micro-batch) and autograd ({result.autograd_per_op_s * 1e6:.1f} us per op), "
                          f"{result.ops[phase]} ops x {result.iterations} steps on "
                          f"{result.world_size} gloo ranks; thread CPU time")
