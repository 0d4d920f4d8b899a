"""Stage-level plans: contiguous ranges of a model's layer chain, each on a submesh with an intra-stage plan.

The layer chain of a transformer is [embedding, block 0, ..., block L-1, head]: unit 0 is the embedding, unit
i (1 <= i <= L) is block i-1, unit L+1 is the head. A stage holds units [first, end). A submesh is n nodes x m
devices (Alpa, Zheng et al. 2022, sec. 5.2: (1, 2^k) inside a node, or whole nodes); an intra-stage plan is the
tensor- and data-parallel degrees (tp x dp = the mesh's devices) and sequence parallelism.

The pipeline's iteration time from stage latencies is PredTOP eq. (4) (Alpa sec. 5.2):
T = sum_i t_i + (B - 1) max_j t_j, with t_i one micro-batch's forward and backward on stage i.
A stage under 1F1B holds the activations of (stages from it to the last, inclusive) micro-batches
(Narayanan et al. 2021), capped at B: its memory is states + in_flight x activations per micro-batch.

A plan maps onto ParallelSpec's per-stage layer lists through StagePlan.stage_blocks (the blocks of each stage).
"""

from dataclasses import dataclass

from trainsim.divisors import divisors
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec, TransformerSpec


@dataclass(frozen=True, slots=True, order=True)
class Mesh:
    """A submesh: nodes x devices per node."""

    nodes: int
    devices_per_node: int

    def __post_init__(self) -> None:
        for name in ("nodes", "devices_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"mesh.{name}", value, "must be a positive integer")

    @property
    def size(self) -> int:
        return self.nodes * self.devices_per_node

    def describe(self) -> str:
        return f"{self.nodes}x{self.devices_per_node}"


@dataclass(frozen=True, slots=True, order=True)
class IntraPlan:
    """The plan inside a stage: tp x dp devices, sequence parallelism with tp."""

    tp: int = 1
    dp: int = 1
    sp: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"intra.{name}", value, "must be a positive integer")
        if self.sp and self.tp == 1:
            raise ConfigError("intra.sp", self.sp, "sequence parallelism needs tp > 1")

    @property
    def devices(self) -> int:
        return self.tp * self.dp

    def describe(self) -> str:
        return f"tp{self.tp}-dp{self.dp}" + ("-sp" if self.sp else "")


@dataclass(frozen=True, slots=True, order=True)
class StageSpec:
    """Units [first, end) of the layer chain on `mesh` with `intra`."""

    first: int
    end: int
    mesh: Mesh
    intra: IntraPlan

    def __post_init__(self) -> None:
        if not 0 <= self.first < self.end:
            raise ConfigError("stage", (self.first, self.end), "needs 0 <= first < end (a non-empty unit range)")
        if self.intra.devices != self.mesh.size:
            raise ConfigError("stage.intra", self.intra.describe(),
                              f"tp x dp must equal the mesh's {self.mesh.size} devices")

    def describe(self) -> str:
        return f"units [{self.first},{self.end}) on {self.mesh.describe()} {self.intra.describe()}"


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One stage's cost: one micro-batch's forward + backward (s), model states and activations of one
    micro-batch per device (bytes)."""

    latency_s: float
    state_bytes: float
    activation_bytes: float

    def __post_init__(self) -> None:
        for name in ("latency_s", "state_bytes", "activation_bytes"):
            value = getattr(self, name)
            if not (value == value and 0.0 <= value < float("inf")):
                raise ConfigError(f"stage_estimate.{name}", value, "must be finite and >= 0")

    def memory_bytes(self, in_flight: int) -> float:
        return self.state_bytes + in_flight * self.activation_bytes


def in_flight(stages_from_here: int, num_micro_batches: int) -> int:
    """Micro-batches whose activations a 1F1B stage holds: the stages from it to the last, at most B."""
    return min(stages_from_here, num_micro_batches)


def pipeline_time_s(latencies: list[float], num_micro_batches: int) -> float:
    """PredTOP eq. (4): T = sum t_i + (B - 1) max t_j."""
    if not latencies:
        raise ConfigError("stages", latencies, "a pipeline needs at least one stage")
    if num_micro_batches <= 0:
        raise ConfigError("num_micro_batches", num_micro_batches, "must be a positive integer")
    return sum(latencies) + (num_micro_batches - 1) * max(latencies)


@dataclass(frozen=True, slots=True)
class StagePlan:
    """A pipeline of stages covering the chain, with their estimates, and what finding it cost."""

    stages: tuple[StageSpec, ...]
    estimates: tuple[StageEstimate, ...]
    num_micro_batches: int
    stage_evaluations: int = 0  # stage estimates the search asked for (distinct stage, mesh, intra plan)

    def __post_init__(self) -> None:
        if not self.stages or len(self.stages) != len(self.estimates):
            raise ConfigError("plan.stages", len(self.stages), "needs one estimate per stage, at least one")
        for before, after in zip(self.stages, self.stages[1:], strict=False):
            if before.end != after.first:
                raise ConfigError("plan.stages", after.describe(), f"must start where the stage before ends "
                                  f"({before.end})")

    @property
    def iteration_s(self) -> float:
        return pipeline_time_s([e.latency_s for e in self.estimates], self.num_micro_batches)

    @property
    def devices(self) -> int:
        return sum(stage.mesh.size for stage in self.stages)

    def peak_memory_bytes(self) -> float:
        count = len(self.stages)
        return max(e.memory_bytes(in_flight(count - i, self.num_micro_batches))
                   for i, e in enumerate(self.estimates))

    def stage_blocks(self) -> list[list[int]]:
        """The transformer blocks (0-based) each stage holds: the per-stage layer lists of a ParallelSpec. The
        embedding (unit 0) and head (last unit) are not blocks; a stage of only them holds none."""
        return [[unit - 1 for unit in range(stage.first, stage.end) if unit >= 1 and unit - 1 < self._blocks()]
                for stage in self.stages]

    def _blocks(self) -> int:
        return self.stages[-1].end - 2

    def to_dict(self) -> dict[str, object]:
        return {
            "iteration_s": self.iteration_s,
            "num_micro_batches": self.num_micro_batches,
            "stages": [{"units": [s.first, s.end], "blocks": blocks, "mesh": s.mesh.describe(), "tp": s.intra.tp,
                        "dp": s.intra.dp, "sp": s.intra.sp, "latency_s": e.latency_s,
                        "state_bytes": e.state_bytes, "activation_bytes": e.activation_bytes}
                       for s, e, blocks in zip(self.stages, self.estimates, self.stage_blocks(), strict=True)],
        }


def num_units(model: ModelSpec) -> int:
    """Units of the layer chain: embedding, the blocks, head."""
    if not isinstance(model, TransformerSpec):
        raise ConfigError("model", model.name, "stage planning needs a transformer (a chain of blocks)")
    return model.num_layers + 2


def unit_kind(model: TransformerSpec, unit: int) -> str:
    """embedding | block | moe_block | head (TransformerSpec.is_moe_block, as the catalog front-end places
    them)."""
    if unit == 0:
        return "embedding"
    if unit == model.num_layers + 1:
        return "head"
    block = unit - 1
    if model.is_moe_block(block):
        return "moe_block"
    return "block"


def submeshes(cluster: ClusterSpec) -> list[Mesh]:
    """Alpa's submesh shapes (sec. 5.2): (1, 2^k) up to a node, then (n, M) of whole nodes."""
    per_node = cluster.gpus_per_node
    meshes = [Mesh(1, 2**k) for k in range(per_node.bit_length()) if 2**k <= per_node]
    if meshes[-1].devices_per_node != per_node:
        meshes.append(Mesh(1, per_node))
    meshes += [Mesh(n, per_node) for n in range(2, cluster.num_nodes + 1)]
    return meshes


def intra_plans(model: TransformerSpec, mesh: Mesh, *, sp: bool = False) -> list[IntraPlan]:
    """tp inside a node dividing the heads (and the kv heads), dp the rest; with sp, tp > 1 plans also with sp."""
    plans: list[IntraPlan] = []
    kv = model.num_kv_heads or model.num_heads
    for tp in divisors(mesh.devices_per_node):
        if model.num_heads % tp or kv % tp:
            continue
        plans.append(IntraPlan(tp, mesh.size // tp))
        if sp and tp > 1:
            plans.append(IntraPlan(tp, mesh.size // tp, True))
    return plans
