"""PredTOP as a stage cost source (sec. VI): per mesh and intra plan, measure a random sample of the stages
(profiling phase), train a predictor on their DAGs (training phase), predict every stage the planner asks
(prediction phase). Latency comes from the predictor; memory, which PredTOP does not predict, from `memory`
(the pricing service's states and activations)."""

import random
from dataclasses import dataclass, field

from trainsim.search.predtop.dag import DagBuilder
from trainsim.search.predtop.train import Predictor, train
from trainsim.search.stage_costs import StageCosts, prefetch
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StageSpec

MIN_SAMPLES = 8


@dataclass(slots=True)
class PredTopStageCosts:
    measured: StageCosts
    memory: StageCosts
    dags: DagBuilder
    num_units: int
    fraction: float = 0.3  # of a mesh's stages measured to train its predictor
    kind: str = "transformer"
    epochs: int = 500
    patience: int = 200
    seed: int = 0
    profiled: set[StageSpec] = field(default_factory=set)
    predictors: dict[tuple[Mesh, IntraPlan], Predictor | None] = field(default_factory=dict)
    train_time_s: float = 0.0
    _predicted: dict[StageSpec, float] = field(default_factory=dict)

    @property
    def profiled_configurations(self) -> int:
        return len(self.profiled)

    def _ranges(self) -> list[tuple[int, int]]:
        return [(a, b) for a in range(self.num_units) for b in range(a + 1, self.num_units + 1)]

    def _fit(self, mesh: Mesh, intra: IntraPlan) -> Predictor | None:
        ranges = self._ranges()
        rng = random.Random(f"{self.seed}:{mesh.describe()}:{intra.describe()}")
        count = min(len(ranges), max(MIN_SAMPLES, round(self.fraction * len(ranges))))
        sample = [StageSpec(a, b, mesh, intra) for a, b in rng.sample(ranges, count)]
        prefetch(self.measured, sample)
        self.profiled.update(sample)
        known = [(s, e) for s in sample if (e := self.measured.estimate(s)) is not None]
        if len(known) < 2:
            return None
        n_val = max(1, len(known) // 8)
        fit, val = known[n_val:], known[:n_val]
        predictor = train(self.kind, [self.dags.stage(s.first, s.end) for s, _ in fit],
                          [e.latency_s for _, e in fit],
                          ([self.dags.stage(s.first, s.end) for s, _ in val], [e.latency_s for _, e in val]),
                          epochs=self.epochs, patience=self.patience, seed=self.seed)
        self.train_time_s += predictor.train_time_s
        return predictor

    def prefetch(self, stages: list[StageSpec]) -> None:
        """Train the predictors of the meshes asked and predict their stages in batches."""
        groups: dict[tuple[Mesh, IntraPlan], list[StageSpec]] = {}
        for stage in stages:
            if stage not in self._predicted:
                groups.setdefault((stage.mesh, stage.intra), []).append(stage)
        for key, group in groups.items():
            if key not in self.predictors:
                self.predictors[key] = self._fit(*key)
            predictor = self.predictors[key]
            if predictor is None:
                continue
            values = predictor.predict_s([self.dags.stage(s.first, s.end) for s in group])
            for stage, value in zip(group, values, strict=True):
                self._predicted[stage] = max(value, 0.0)

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        if stage not in self._predicted:
            self.prefetch([stage])
        latency = self._predicted.get(stage)
        memory = self.memory.estimate(stage)
        if latency is None or memory is None:
            return None
        return StageEstimate(latency, memory.state_bytes, memory.activation_bytes)
