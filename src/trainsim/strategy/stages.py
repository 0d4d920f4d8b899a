"""Pipeline stages: which layers (and how many repeats) each pipeline rank holds."""

from dataclasses import dataclass

from trainsim.errors import ConfigError
from trainsim.ir.graph import Layer, OpGraph


@dataclass(frozen=True, slots=True)
class StagePart:
    layer: Layer
    count: float  # repeats of this layer on the stage (fractional when blocks do not split evenly by kind)


def partition_stages(graph: OpGraph, pp: int) -> list[list[StagePart]]:
    """Blocks split evenly over pp stages (as Megatron-LM does); the embedding on the first stage, the head on
    the last. Non-block layers of CNNs and DLRMs are dealt out in order, balancing the layer count."""
    stages: list[list[StagePart]] = [[] for _ in range(pp)]
    repeated = [layer for layer in graph.layers if layer.kind in ("block", "moe_block")]
    if repeated:
        for layer in graph.layers:
            if layer.kind == "embedding":
                stages[0].append(StagePart(layer, 1.0))
            elif layer.kind == "head":
                stages[-1].append(StagePart(layer, 1.0))
            elif layer.kind in ("block", "moe_block"):
                for stage in stages:
                    stage.append(StagePart(layer, layer.count / pp))
            else:
                stages[0].append(StagePart(layer, float(layer.count)))
        return stages
    flat = [layer for layer in graph.layers for _ in range(layer.count)]
    if len(flat) < pp:
        raise ConfigError("pp", pp, f"must be at most the {len(flat)} layers of {graph.model_name} (a stage with no "
                          "layer)")
    for index, layer in enumerate(flat):
        stages[min(pp - 1, index * pp // max(len(flat), 1))].append(StagePart(layer, 1.0))
    return stages


def in_flight_micro_batches(schedule: str, stage: int, pp: int, vpp: int, num_micro_batches: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the whole stage's activations.

    GPipe holds all m; 1F1B holds p - i on stage i (Narayanan et al. 2021); interleaved 1F1B holds
    (2(p - i - 1) + (v - 1) p + 1) model chunks of 1/v stage each (Megatron-LM's warm-up count), which for the
    first stage is p + (p - 1)/v stages' worth (Korthikanti et al. 2022, sec. 4.2.3).
    """
    if schedule == "gpipe":
        return float(num_micro_batches)
    if schedule == "interleaved-1f1b":
        chunks = 2 * (pp - stage - 1) + (vpp - 1) * pp + 1
        return min(chunks, num_micro_batches * vpp) / vpp
    return float(min(num_micro_batches, pp - stage))
