"""PredTOP as a stage cost source (sec. VI): per mesh and intra plan, measure a random sample of the stages
(profiling phase), train a predictor on their DAGs (training phase), predict every stage the planner asks
(prediction phase). Latency comes from the predictor; memory, which PredTOP does not predict, from `memory`
(the pricing service's states and activations).

The sample (covering_sample) is PredTOP's "stages of different sizes" drawn at random, stratified so that the
kinds of stage the planner's DP decides between are all seen: each unit kind alone (embedding, block, MoE block,
head: a lone embedding or head is a DAG unlike any other stage, sec. IV-B1's model cannot extrapolate to it),
then random ranges taken in turn from the stages that start at the embedding, those that end at the head and the
interior ones. Every pipeline has one first and one last stage, so those two strata decide the plan; a plain
random draw of 30% of the ranges may hold none or one of them (random_sample, kept for comparison).

Stages are ranges of layers: of units by default, of Alpa's clustered layers where `layer_cuts` is set (the
paper's stages, sec. IV-B1 and VI: PredTOP plugs into Alpa, whose inter-operator DP runs over the layers its
layer construction made; experiment.alpa_layers). Then the sample, the budget and the predictions are over
ranges of those layers, and a stage that cuts a layer has no estimate (None: the DP does not consider it), as
in Alpa, whose DP never sees it. With our units the embedding (a gather, no matrix product) joins the first
block, so the lone embedding, a 4-node DAG of under 1 ms that no predictor fits (sec. "Small stages are not
fit" of docs/planning.md), is neither trained on nor asked for."""

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from trainsim.search.predtop.dag import DagBuilder
from trainsim.search.predtop.train import Predictor, train
from trainsim.search.stage_costs import StageCosts, prefetch
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StageSpec, unit_kind

MIN_SAMPLES = 8
VALIDATION_FRACTION = 0.1  # PredTOP sec. VIII-A: a separate 10% of the samples for validation
SAMPLERS = ("covering", "sized", "random")
Range = tuple[int, int]


def all_ranges(num_units: int) -> list[Range]:
    return [(a, b) for a in range(num_units) for b in range(a + 1, num_units + 1)]


def sample_budget(num_units: int, fraction: float) -> tuple[int, int]:
    """(training, validation) stages profiled per mesh and intra plan when every range of `num_units` layers may
    be asked: budget_of(the number of ranges)."""
    return budget_of(len(all_ranges(num_units)), fraction)


def budget_of(num_stages: int, fraction: float) -> tuple[int, int]:
    """(training, validation) stages profiled out of `num_stages` a mesh and intra plan may be asked for: the
    training fraction (at least MIN_SAMPLES) and a separate 10% for early stopping, as sec. VIII-A splits (both
    profiled, both counted); all of them at most. Validation was len(sample) // 8 of the training sample: 2
    stages at 30% of 55, on which early stopping kept the weights of epoch 7 (MoE, 1 rank)."""
    training = min(num_stages, max(MIN_SAMPLES, round(fraction * num_stages)))
    validation = min(num_stages - training, max(1, round(VALIDATION_FRACTION * num_stages)))
    return training, validation


def random_sample(num_units: int, count: int, rng: random.Random, kinds: list[str],
                  population: list[Range] | None = None) -> list[Range]:
    """`count` ranges drawn uniformly without replacement (the first planner's sampler) from `population` (every
    range when None). `kinds` is unused."""
    del kinds
    return rng.sample(all_ranges(num_units) if population is None else population, count)


def stratum(rng_: Range, num_units: int) -> str:
    """head: ends at the head (the whole model included); embedding: starts at the embedding; interior."""
    first, end = rng_
    return "head" if end == num_units else "embedding" if first == 0 else "interior"


def _anchors_and_strata(num_units: int, count: int, rng: random.Random, kinds: list[str],
                        population: list[Range] | None) -> tuple[list[Range], dict[str, list[Range]]]:
    """One lone unit of each kind (the unit of a kind picked at random among those alone in `population`; a kind
    with none is skipped), and the other ranges of `population` (every range when None) per stratum, shuffled."""
    ranges = all_ranges(num_units) if population is None else population
    alone = {first for first, end in ranges if end == first + 1}
    units_of: dict[str, list[int]] = {}
    for unit, kind in enumerate(kinds):
        if unit in alone:
            units_of.setdefault(kind, []).append(unit)
    if len(kinds) != num_units or count < len(units_of):
        raise ValueError(f"count={count}, kinds={len(kinds)}: one kind per unit, count >= {len(units_of)} kinds")
    chosen = [(u, u + 1) for u in (rng.choice(units) for units in units_of.values())]
    left: dict[str, list[Range]] = {"head": [], "embedding": [], "interior": []}
    for r in ranges:
        if r not in chosen:
            left[stratum(r, num_units)].append(r)
    for pool in left.values():
        rng.shuffle(pool)
    return chosen, left


def covering_sample(num_units: int, count: int, rng: random.Random, kinds: list[str],
                    population: list[Range] | None = None) -> list[Range]:
    """`count` ranges (count >= the number of unit kinds): one lone unit of each kind (kinds[u] is unit u's
    kind; the unit of a kind picked at random), then ranges drawn at random from the head, embedding and
    interior strata in turn (a stratum left empty is skipped). Sizes are random within a stratum, so all sizes
    occur. The order is the order drawn: the anchors first. Drawn from `population` (every range when None)."""
    chosen, left = _anchors_and_strata(num_units, count, rng, kinds, population)
    while len(chosen) < count and any(left.values()):
        for pool in left.values():
            if pool and len(chosen) < count:
                chosen.append(pool.pop())
    return chosen


def sized_sample(num_units: int, count: int, rng: random.Random, kinds: list[str],
                 population: list[Range] | None = None) -> list[Range]:
    """covering_sample's anchors and strata in turn, each draw taking (at random) a range of the size the sample
    holds fewest of so far (sizes 1 .. num_units): "stages of different sizes" (PredTOP sec. IV-B1), spread over
    the sizes instead of left to chance. With 14 training stages of 45 a random size per draw left the MoE
    model's interior stages of 2-4 layers (the ones a 4-stage pipeline is made of) unsampled. Drawn from
    `population` (every range when None)."""
    chosen, left = _anchors_and_strata(num_units, count, rng, kinds, population)
    held = [0] * (num_units + 1)
    for first, end in chosen:
        held[end - first] += 1
    while len(chosen) < count and any(left.values()):
        for pool in left.values():
            if pool and len(chosen) < count:
                pick = min(range(len(pool)), key=lambda i: (held[pool[i][1] - pool[i][0]], i))
                first, end = pool.pop(pick)
                held[end - first] += 1
                chosen.append((first, end))
    return chosen


SAMPLER_FUNCTIONS: dict[str, Callable[[int, int, random.Random, list[str], list[Range] | None], list[Range]]] = {
    "covering": covering_sample, "sized": sized_sample, "random": random_sample}


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
    sampler: str = "sized"
    trainer: Callable[..., Predictor] = train  # predictor.train; a stub in the tests
    layer_cuts: tuple[int, ...] | None = None  # layer boundaries in units (alpa_layers); None: every unit
    # the stages the planner can use (stage_dp.usable_filter: in some plan on exactly its devices); None: every one
    usable: Callable[[StageSpec], bool] | None = None
    profiled: set[StageSpec] = field(default_factory=set)
    predictors: dict[tuple[Mesh, IntraPlan], Predictor | None] = field(default_factory=dict)
    train_time_s: float = 0.0  # wall time of the fits
    train_cpu_s: float = 0.0  # their CPU time (the training thread's)
    _predicted: dict[StageSpec, float] = field(default_factory=dict)

    @property
    def profiled_configurations(self) -> int:
        return len(self.profiled)

    def cost_detail(self) -> dict[str, object]:
        """What the search's optimisation cost went to: the fits (wall and CPU time; the epochs each ran, which
        early stopping sets from the measured labels, so that fits of two searches compare per epoch) and the stage
        measurements (the measured source's), the meshes fitted and those measured whole."""
        detail = dict(getattr(self.measured, "cost_detail", dict)())
        detail.update(train_wall_s=self.train_time_s, train_cpu_s=self.train_cpu_s,
                      epochs_run={f"{mesh.describe()}/{intra.describe()}": p.epochs_run
                                  for (mesh, intra), p in self.predictors.items() if p is not None},
                      meshes_trained=sum(p is not None for p in self.predictors.values()),
                      meshes_measured_whole=sum(p is None for p in self.predictors.values()))
        return detail

    @property
    def predicted(self) -> dict[StageSpec, float]:
        """Every stage predicted so far and its predicted latency (s)."""
        return dict(self._predicted)

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler={self.sampler!r}: must be one of {', '.join(SAMPLERS)}")
        cuts = self.cuts
        if cuts[0] != 0 or cuts[-1] != self.num_units or any(b <= a for a, b in pairwise(cuts)):
            raise ValueError(f"layer_cuts={self.layer_cuts}: must rise from 0 to {self.num_units} units")

    @property
    def cuts(self) -> tuple[int, ...]:
        """Layer boundaries in units (every unit a layer unless layer_cuts is set)."""
        return self.layer_cuts if self.layer_cuts is not None else tuple(range(self.num_units + 1))

    @property
    def num_layers(self) -> int:
        return len(self.cuts) - 1

    def in_layers(self, stage: StageSpec) -> bool:
        """Whether the stage is a range of whole layers (the stages PredTOP samples and predicts)."""
        return stage.first in self.cuts and stage.end in self.cuts

    def population(self, mesh: Mesh, intra: IntraPlan) -> list[Range]:
        """The ranges of layers (indices into the layers) a mesh and intra plan may be asked for: every one, or
        those `usable` keeps (PredTOP sec. VI samples "from all possible stages")."""
        cuts = self.cuts
        return [(a, b) for a, b in all_ranges(self.num_layers)
                if self.usable is None or self.usable(StageSpec(cuts[a], cuts[b], mesh, intra))]

    def budget(self, mesh: Mesh, intra: IntraPlan) -> tuple[int, int]:
        return budget_of(len(self.population(mesh, intra)), self.fraction)

    def sample(self, mesh: Mesh, intra: IntraPlan) -> list[StageSpec]:
        """The stages profiled for one mesh and intra plan (seeded per mesh and plan): budget_of's training and
        validation stages of its population, in the order drawn (validation: the last)."""
        rng = random.Random(f"{self.seed}:{mesh.describe()}:{intra.describe()}")
        cuts = self.cuts
        kinds = ["+".join(unit_kind(self.dags.model, u) for u in range(a, b)) for a, b in pairwise(cuts)]
        population = self.population(mesh, intra)
        ranges = SAMPLER_FUNCTIONS[self.sampler](self.num_layers, sum(budget_of(len(population), self.fraction)),
                                                 rng, kinds, population)
        return [StageSpec(cuts[a], cuts[b], mesh, intra) for a, b in ranges]

    def measures_all(self, mesh: Mesh, intra: IntraPlan) -> bool:
        """Whether the budget takes every stage of the population: then every one is measured and nothing is
        trained (a predictor of the stages one measured would only add its error and its training time)."""
        return sum(self.budget(mesh, intra)) >= len(self.population(mesh, intra))

    def validation_count(self, known: int, mesh: Mesh, intra: IntraPlan) -> int:
        """How many of `known` (>= 2) profiled stages watch early stopping: the last drawn, so a covering sample's
        lone units stay in training and its validation stages take the three strata in turn."""
        return max(1, min(self.budget(mesh, intra)[1], known - 1))

    def roles(self, mesh: Mesh, intra: IntraPlan) -> dict[StageSpec, str]:
        """Each profiled stage of a mesh and intra plan: "train" or "val", or "measured" on a mesh whose stages are
        all measured (measures_all); the stages not here were predicted only (test)."""
        sample = self.sample(mesh, intra)
        if self.measures_all(mesh, intra):
            return dict.fromkeys(sample, "measured")
        n_val = self.validation_count(len(sample), mesh, intra)
        return {stage: "val" if i >= len(sample) - n_val else "train" for i, stage in enumerate(sample)}

    def _fit(self, mesh: Mesh, intra: IntraPlan) -> Predictor | None:
        sample = self.sample(mesh, intra)
        prefetch(self.measured, sample)
        self.profiled.update(sample)
        if self.measures_all(mesh, intra):
            for stage in sample:
                found = self.measured.estimate(stage)
                if found is not None:
                    self._predicted[stage] = found.latency_s
            return None
        known = [(s, e) for s in sample if (e := self.measured.estimate(s)) is not None]
        if len(known) < 2:
            return None
        n_val = self.validation_count(len(known), mesh, intra)
        fit, val = known[:-n_val], known[-n_val:]
        predictor = self.trainer(self.kind, [self.dags.stage(s.first, s.end) for s, _ in fit],
                                 [e.latency_s for _, e in fit],
                                 ([self.dags.stage(s.first, s.end) for s, _ in val], [e.latency_s for _, e in val]),
                                 epochs=self.epochs, patience=self.patience, seed=self.seed)
        self.train_time_s += predictor.train_time_s
        self.train_cpu_s += getattr(predictor, "train_cpu_s", 0.0)
        return predictor

    def prefetch(self, stages: list[StageSpec]) -> None:
        """Train the predictors of the meshes asked and predict their stages in batches."""
        groups: dict[tuple[Mesh, IntraPlan], list[StageSpec]] = {}
        for stage in stages:
            if stage not in self._predicted and self.in_layers(stage):
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
        if not self.in_layers(stage):
            return None
        if stage not in self._predicted:
            self.prefetch([stage])
        latency = self._predicted.get(stage)
        memory = self.memory.estimate(stage)
        if latency is None or memory is None:
            return None
        return StageEstimate(latency, memory.state_bytes, memory.activation_bytes)
