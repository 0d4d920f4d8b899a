"""MPE: the Markovian Performance Estimator (Yun and Park 2023, sec. III-A).

Per submesh and intra plan (the paper's device mesh (X, Y)), the layer chain is a Markov chain:
- a node per distinct layer, P(i) = R(i, i), the measured cost of running layer i alone (eq. 1);
- an edge between adjacent layers, P(i -> i+1) = R(i, i+1) - R(i, i) - R(i+1, i+1) (eq. 2): what running them
  together adds or saves (a change of sharding at the boundary, fusion across it);
- a stage's estimate is the sum of the nodes and edges it visits.
Layers with the same operators are measured once (the paper's string matching of layers; here the unit kind:
embedding, block, moe_block, head), and so are edges between the same pair of kinds. The same chain is built
for memory (model states and one micro-batch's activations).

The naive estimator drops the edges (nodes only), as the paper's baseline does. `profiled_configurations`
counts the R(x, y) the chains asked of the measured source; the exhaustive baseline (every stage measured,
Alpa's way) is CountedStageCosts over the source itself.
"""

from dataclasses import dataclass, field

from trainsim.ir.model_spec import TransformerSpec
from trainsim.search.stage_costs import StageCosts, prefetch
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StageSpec, unit_kind

Key = tuple[str, ...]  # the kinds of the units a measurement ran: (kind,) for a node, (a, b) for an edge


@dataclass(slots=True)
class _Chain:
    """One (mesh, intra plan)'s node and edge values: (latency_s, state_bytes, activation_bytes)."""

    nodes: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    edges: dict[tuple[str, str], tuple[float, float, float]] = field(default_factory=dict)
    failed: bool = False


def _values(estimate: StageEstimate) -> tuple[float, float, float]:
    return estimate.latency_s, estimate.state_bytes, estimate.activation_bytes


@dataclass(slots=True)
class MpeStageCosts:
    """Stage estimates from MPE's chain over `measured` (R(x, y)); edges=False is the naive estimator."""

    measured: StageCosts
    model: TransformerSpec
    edges: bool = True
    dedup: bool = True
    _chains: dict[tuple[Mesh, IntraPlan], _Chain] = field(default_factory=dict)
    _runs: dict[tuple[Mesh, IntraPlan, object], StageEstimate | None] = field(default_factory=dict)

    @property
    def profiled_configurations(self) -> int:
        """The R(x, y) measured: distinct nodes and edges per (mesh, intra plan)."""
        return len(self._runs)

    def _measure(self, mesh: Mesh, intra: IntraPlan, first: int, end: int, key: object) -> StageEstimate | None:
        run_key = (mesh, intra, key)
        if run_key not in self._runs:
            self._runs[run_key] = self.measured.estimate(StageSpec(first, end, mesh, intra))
        return self._runs[run_key]

    def _key(self, unit: int, count: int) -> object:
        """What a run of `count` units from `unit` is keyed by: their kinds (dedup) or their positions."""
        if not self.dedup:
            return (unit, count)
        return tuple(unit_kind(self.model, u) for u in range(unit, unit + count))

    def node(self, mesh: Mesh, intra: IntraPlan, unit: int) -> tuple[float, float, float] | None:
        estimate = self._measure(mesh, intra, unit, unit + 1, self._key(unit, 1))
        return None if estimate is None else _values(estimate)

    def edge(self, mesh: Mesh, intra: IntraPlan, unit: int) -> tuple[float, float, float] | None:
        """P(unit -> unit + 1) of eq. 2."""
        pair = self._measure(mesh, intra, unit, unit + 2, self._key(unit, 2))
        a, b = self.node(mesh, intra, unit), self.node(mesh, intra, unit + 1)
        if pair is None or a is None or b is None:
            return None
        together = _values(pair)
        return tuple(t - x - y for t, x, y in zip(together, a, b, strict=True))  # type: ignore[return-value]

    def prefetch(self, stages: list[StageSpec]) -> None:
        """The node and edge runs these stages' chains read, passed on to the measured source at once."""
        runs: dict[tuple[Mesh, IntraPlan, object], StageSpec] = {}
        for stage in stages:
            for unit in range(stage.first, stage.end):
                for count in (1, 2) if self.edges else (1,):
                    if count == 2 and unit + 1 >= stage.end:
                        continue
                    key = (stage.mesh, stage.intra, self._key(unit, count))
                    if key not in self._runs:
                        runs.setdefault(key, StageSpec(unit, unit + count, stage.mesh, stage.intra))
        prefetch(self.measured, list(runs.values()))

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        totals = [0.0, 0.0, 0.0]
        for unit in range(stage.first, stage.end):
            node = self.node(stage.mesh, stage.intra, unit)
            if node is None:
                return None
            totals = [t + v for t, v in zip(totals, node, strict=True)]
            if self.edges and unit + 1 < stage.end:
                edge = self.edge(stage.mesh, stage.intra, unit)
                if edge is None:
                    return None
                totals = [t + v for t, v in zip(totals, edge, strict=True)]
        # a chain sum is an estimate: an edge may make it slightly negative for tiny stages
        return StageEstimate(*(max(0.0, value) for value in totals))


def exhaustive_evaluations(num_layers: int, mesh_configs: int) -> int:
    """Alpa's stage evaluations: every contiguous range of L layers on every (mesh, intra plan),
    L (L + 1) / 2 x configs (MPE sec. III-A: 17,850 for GPT-2 1.5B on 8 GPUs)."""
    return num_layers * (num_layers + 1) // 2 * mesh_configs


def mpe_evaluations(num_layers: int, mesh_configs: int) -> int:
    """MPE's without deduplication: L nodes and L - 1 edges per (mesh, intra plan) (the paper's 1,386)."""
    return (2 * num_layers - 1) * mesh_configs
