"""PredTOP's planner sample (search.predtop.costs): the covering sampler sees every unit kind and both ends of
the chain, the budget is what is profiled, and a predictor blind to the head (a stub) picks the wrong split where
a covering sample gives it the head; the sized sampler trains on every stage size; with Alpa's layers (layer_cuts)
only ranges of whole layers are sampled, predicted and offered to the DP."""

import random
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytest

from trainsim.ir.model_spec import TransformerSpec
from trainsim.search.predtop.costs import (
    PredTopStageCosts,
    all_ranges,
    covering_sample,
    random_sample,
    sample_budget,
    sized_sample,
    stratum,
)
from trainsim.search.stage_costs import FunctionStageCosts
from trainsim.search.stage_dp import alpa_dp, usable_filter
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StageSpec, pipeline_time_s, unit_kind

GPT_KINDS = ["embedding"] + ["block"] * 8 + ["head"]
MOE_KINDS = ["embedding"] + ["block", "moe_block"] * 4 + ["head"]


def test_budget_is_the_fraction_of_every_range_with_a_floor():
    assert len(all_ranges(10)) == 55
    # (training, validation) profiled per mesh and intra plan: 30% of the ranges and a separate 10%
    assert sample_budget(10, 0.3) == (16, 6)  # 55 ranges: round(16.5), round(5.5)
    assert sample_budget(18, 0.3) == (51, 17)  # 171 ranges
    assert sample_budget(4, 0.3) == (8, 1)  # 10 ranges: the training floor
    assert sample_budget(3, 0.3) == (6, 0)  # 6 ranges: all of them train


@pytest.mark.parametrize("kinds", [GPT_KINDS, MOE_KINDS])
@pytest.mark.parametrize("seed", range(20))
def test_covering_sample_holds_every_kind_alone_and_both_ends(kinds, seed):
    n = len(kinds)
    sample = covering_sample(n, 16, random.Random(seed), kinds)
    assert len(sample) == len(set(sample)) == 16
    assert all(0 <= a < b <= n for a, b in sample)
    lone = [a for a, b in sample[:len(set(kinds))]]
    assert all(b == a + 1 for a, b in sample[:len(set(kinds))])
    assert sorted({kinds[u] for u in lone}) == sorted(set(kinds))  # embedding alone, head alone, each block kind
    strata = [stratum(r, n) for r in sample[len(set(kinds)):]]
    # after the lone units the three strata take turns: (16 - kinds) / 3 each, give or take one
    for name in ("head", "embedding", "interior"):
        assert strata.count(name) >= (16 - len(set(kinds))) // 3
    assert {b - a for a, b in sample} != {1}  # sizes vary


def test_covering_sample_exact_small_case():
    # 4 units [emb, block, block, head], 6 stages: (0,1), a lone block, (3,4); then a head-side, an
    # embedding-side and an interior range.
    kinds = ["embedding", "block", "block", "head"]
    sample = covering_sample(4, 6, random.Random(0), kinds)
    assert sample[0] == (0, 1) and sample[1] in [(1, 2), (2, 3)] and sample[2] == (3, 4)
    assert [stratum(r, 4) for r in sample[3:]] == ["head", "embedding", "interior"]
    # every range when the budget is every range
    assert sorted(covering_sample(4, 10, random.Random(0), kinds)) == all_ranges(4)


def test_covering_sample_refuses_a_budget_below_the_kinds():
    with pytest.raises(ValueError, match="count=2"):
        covering_sample(4, 2, random.Random(0), ["embedding", "block", "block", "head"])


def test_random_sample_may_miss_the_head():
    # the first sampler: a uniform draw of 16 of 55 ranges; some seeds hold no stage ending at the head
    misses = [s for s in range(200) if all(b < 10 for a, b in random_sample(10, 16, random.Random(s), GPT_KINDS))]
    assert misses  # about 1 draw in 50: C(45, 16) / C(55, 16)
    assert not [s for s in range(200) if all(b < 10 for a, b in covering_sample(10, 16, random.Random(s),
                                                                                  GPT_KINDS))]


# --- a predictor blind to the head picks the wrong split ---------------------------------------------------

TINY = TransformerSpec(name="tiny", arch="gpt", num_layers=4, hidden=8, ffn_hidden=32, num_heads=2, vocab=64,
                       max_seq_len=8)
UNIT_S = {"embedding": 1.0, "block": 10.0, "head": 40.0}  # 6 units: emb, 4 blocks, a head of 4 blocks
ONE = Mesh(1, 1)
B = 8


def truth(stage: StageSpec) -> StageEstimate:
    return StageEstimate(sum(UNIT_S[unit_kind(TINY, u)] for u in range(stage.first, stage.end)), 0.0, 0.0)


@dataclass
class RangeDags:
    """The stub's 'DAG' of a stage is its unit range."""

    model: TransformerSpec = TINY

    def stage(self, first: int, end: int) -> tuple[int, int]:
        return (first, end)


@dataclass
class KindSumPredictor:
    """A stage's latency as the sum of per-kind unit costs fitted by least squares on the training stages; a
    kind no training stage holds gets 0 (the minimum-norm solution): blind to it."""

    cost: dict[str, float]
    train_time_s: float = 0.0
    epochs_run: int = 0

    def predict_s(self, ranges: list[tuple[int, int]]) -> list[float]:
        return [sum(self.cost[unit_kind(TINY, u)] for u in range(a, b)) for a, b in ranges]


def fit_kind_sum(kind, ranges, latencies, validation, **_):
    names = sorted(UNIT_S)
    rows = [[sum(unit_kind(TINY, u) == k for u in range(a, b)) for k in names] for a, b in ranges]
    solution = np.linalg.lstsq(np.array(rows, float), np.array(latencies), rcond=None)[0]
    return KindSumPredictor(dict(zip(names, map(float, solution), strict=True)), epochs_run=len(ranges))


def sampled(sampler: str, seed: int) -> list[StageSpec]:
    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6,  # type: ignore[arg-type]
                               0.3, seed=seed, sampler=sampler)
    return source.sample(ONE, IntraPlan())


def plan_with(sampler: str, seed: int) -> tuple[list[tuple[int, int]], float, PredTopStageCosts]:
    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6,  # type: ignore[arg-type]
                               0.3, seed=seed, sampler=sampler, trainer=cast(Any, fit_kind_sum))
    plan = alpa_dp(source, 6, [ONE], {ONE: [IntraPlan()]}, 2, B, capacity_bytes=1.0).plan
    measured = pipeline_time_s([truth(s).latency_s for s in plan.stages], B)
    return [(s.first, s.end) for s in plan.stages], measured, source


def test_a_predictor_blind_to_the_head_splits_wrong_and_a_covering_sample_fixes_it():
    # Two stages of 1 device, B = 8, T = 81 + 7 max(t1, t2). Exhaustive: [0,5)+[5,6): 41, 40 -> T = 368.
    exhaustive = alpa_dp(FunctionStageCosts(truth), 6, [ONE], {ONE: [IntraPlan()]}, 2, B, capacity_bytes=1.0).plan
    assert [(s.first, s.end) for s in exhaustive.stages] == [(0, 5), (5, 6)]
    assert exhaustive.iteration_s == pytest.approx(368.0)
    # a random sample of 8 + 2 of the 21 ranges with no stage ending at the head (seed found, not assumed)
    seed = next(s for s in range(5000) if all(stage.end < 6 for stage in sampled("random", s)))
    blind, blind_t, source = plan_with("random", seed)
    assert source.profiled_configurations == 10  # 8 training, 2 validation
    # the head predicted free: [0,3)+[3,6) balanced at 21 / 20 predicted, 21 / 60 measured: T = 81 + 420
    assert blind == [(0, 3), (3, 6)]
    assert blind_t == pytest.approx(501.0)
    covered, covered_t, source = plan_with("covering", seed)
    assert source.profiled_configurations == 10  # the same budget
    assert covered == [(0, 5), (5, 6)]
    assert covered_t == pytest.approx(368.0)


def test_validation_stages_are_the_last_drawn():
    seen: dict[str, list] = {}

    def record(kind, ranges, latencies, validation, **_):
        seen["fit"], seen["val"] = list(ranges), list(validation[0])
        return fit_kind_sum(kind, ranges, latencies, validation)

    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 0.3,  # type: ignore[arg-type]
                               seed=0, trainer=cast(Any, record))
    source.estimate(StageSpec(0, 6, ONE, IntraPlan()))
    drawn = [(s.first, s.end) for s in source.sample(ONE, IntraPlan())]
    assert seen["fit"] + seen["val"] == drawn and len(seen["val"]) == 2  # round(0.1 x 21)
    assert {(0, 1), (5, 6)} <= set(seen["fit"])  # the lone embedding and head train


def test_unknown_sampler_is_refused():
    with pytest.raises(ValueError, match="sampler='every'"):
        PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 0.3,  # type: ignore[arg-type]
                          sampler="every")


def test_every_range_sampled_is_measured_and_nothing_trained():
    def never(*_args, **_kwargs):
        raise AssertionError("a predictor was trained on a mesh whose stages were all measured")

    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 1.0,  # type: ignore[arg-type]
                               trainer=cast(Any, never))
    found = source.estimate(StageSpec(1, 4, ONE, IntraPlan()))
    assert source.profiled_configurations == 21 and source.predictors[(ONE, IntraPlan())] is None
    assert found is not None and found.latency_s == 30.0  # the measurement itself
    assert source.predicted[StageSpec(0, 6, ONE, IntraPlan())] == 81.0


def test_roles_and_predictions_are_kept_per_stage():
    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 0.3,  # type: ignore[arg-type]
                               seed=0, trainer=cast(Any, fit_kind_sum))
    drawn = source.sample(ONE, IntraPlan())
    roles = source.roles(ONE, IntraPlan())
    # sample_budget(6, 0.3) = (8, 2): the first 8 drawn train, the last 2 validate, the other 11 ranges are test
    assert [roles[s] for s in drawn] == ["train"] * 8 + ["val"] * 2 and len(roles) == 10
    assert source.predicted == {}
    asked = [StageSpec(0, 6, ONE, IntraPlan()), StageSpec(1, 3, ONE, IntraPlan())]
    source.prefetch(asked)
    # the covering sample holds each kind alone, so the least-squares kind costs are exact: 1 + 4 x 10 + 40, 2 x 10
    assert source.predicted.keys() == set(asked)
    assert source.predicted[asked[0]] == pytest.approx(81.0) and source.predicted[asked[1]] == pytest.approx(20.0)


def test_every_range_sampled_has_the_measured_role():
    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 1.0)  # type: ignore[arg-type]
    assert set(source.roles(ONE, IntraPlan()).values()) == {"measured"} and len(source.roles(ONE, IntraPlan())) == 21


# --- the population: the stages the planner's DP asks for (stage_dp.usable_filter) ------------------------

TWO = Mesh(1, 2)


def usable_on_two_devices() -> Any:
    return usable_filter(6, [ONE, TWO], 2, equal_meshes=True)


def test_the_sample_is_drawn_from_the_stages_the_dp_can_use():
    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 0.3,  # type: ignore[arg-type]
                               seed=0, trainer=cast(Any, fit_kind_sum), usable=usable_on_two_devices())
    # two 1-device stages on 2 devices: [0,b) for b < 6 and [a,6) for a > 0, 10 of the 21 ranges
    assert source.population(ONE, IntraPlan()) == [(0, b) for b in range(1, 6)] + [(a, 6) for a in range(1, 6)]
    assert source.budget(ONE, IntraPlan()) == (8, 1)  # the training floor, round(0.1 x 10)
    drawn = source.sample(ONE, IntraPlan())
    assert len(drawn) == 9 and all(s.first == 0 or s.end == 6 for s in drawn)
    assert not source.measures_all(ONE, IntraPlan())
    # the 2-device mesh on 2 devices holds the whole chain only: measured, no predictor
    assert source.population(TWO, IntraPlan(1, 2)) == [(0, 6)] and source.measures_all(TWO, IntraPlan(1, 2))
    plan = alpa_dp(source, 6, [TWO], {TWO: [IntraPlan(1, 2)]}, 2, B, capacity_bytes=1.0).plan
    assert plan.stages == (StageSpec(0, 6, TWO, IntraPlan(1, 2)),) and plan.iteration_s == pytest.approx(8 * 81.0)
    assert source.predictors[(TWO, IntraPlan(1, 2))] is None
    assert source.roles(TWO, IntraPlan(1, 2)) == {StageSpec(0, 6, TWO, IntraPlan(1, 2)): "measured"}


@pytest.mark.parametrize("sampler", [covering_sample, sized_sample, random_sample])
@pytest.mark.parametrize("seed", range(5))
def test_samplers_draw_from_the_population_and_every_range_is_the_default(sampler, seed):
    population = [r for r in all_ranges(10) if r[0] == 0 or r[1] == 10]  # two stages: 9 + 9 + the whole chain
    drawn = sampler(10, 12, random.Random(seed), MOE_KINDS, population)
    assert len(set(drawn)) == 12 and set(drawn) <= set(population)
    assert sampler(10, 16, random.Random(seed), MOE_KINDS, all_ranges(10)) == \
        sampler(10, 16, random.Random(seed), MOE_KINDS)
    if sampler is not random_sample:  # the lone units in the population: the embedding and the head
        assert set(drawn[:2]) == {(0, 1), (9, 10)}


ALPA_MOE_KINDS = ["embedding+block"] + ["moe_block", "block"] * 3 + ["moe_block", "head"]  # moe-small's Alpa layers


@pytest.mark.parametrize(("kinds", "count", "trained"), [(ALPA_MOE_KINDS, 18, 14), (MOE_KINDS, 22, 16)])
def test_sized_sample_trains_on_every_stage_size_where_covering_rarely_does(kinds, count, trained):
    n = len(kinds)
    every_size = set(range(1, n + 1))

    def all_sizes(sampler, seed: int) -> bool:
        return {b - a for a, b in sampler(n, count, random.Random(seed), kinds)[:trained]} == every_size

    assert all(all_sizes(sized_sample, seed) for seed in range(100))
    assert sum(all_sizes(covering_sample, seed) for seed in range(100)) < 10  # 1 / 100 and 4 / 100 when written


@pytest.mark.parametrize("seed", range(20))
def test_sized_sample_keeps_the_covering_anchors_and_draws_distinct_ranges(seed):
    sample = sized_sample(10, 16, random.Random(seed), MOE_KINDS)
    assert len(set(sample)) == 16 and set(sample) <= set(all_ranges(10))
    assert [MOE_KINDS[a] for a, b in sample[:4]] == ["embedding", "block", "moe_block", "head"]
    assert all(b == a + 1 for a, b in sample[:4])


@pytest.mark.parametrize("seed", range(10))
def test_sized_sample_exact_small_case(seed):
    # 4 units (emb, block, block, head): anchors (0,1), one lone block, (3,4): size 1 held 3 times. Then head,
    # embedding, interior in turn: the interior stratum holds the other lone block (size 1) and (1,3) (size 2,
    # held at most once): the least held size wins, so the interior draw is (1,3) whatever the shuffle.
    kinds = ["embedding", "block", "block", "head"]
    sample = sized_sample(4, 6, random.Random(seed), kinds)
    assert sample[0] == (0, 1) and sample[1] in ((1, 2), (2, 3)) and sample[2] == (3, 4)
    assert sample[3][1] == 4 and sample[4][0] == 0 and sample[5] == (1, 3)
    assert sorted(sized_sample(4, 10, random.Random(seed), kinds)) == all_ranges(4)


CUTS = (0, 2, 3, 4, 5, 6)  # TINY's units [emb, b0, b1, b2, b3, head] with the embedding joined to block 0


def test_layer_cuts_sample_and_predict_whole_layers_only():
    seen: dict[str, list] = {}

    def record(kind, ranges, latencies, validation, **_):
        seen["fit"] = list(ranges) + list(validation[0])
        return fit_kind_sum(kind, ranges, latencies, validation)

    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 0.3,  # type: ignore[arg-type]
                               seed=0, trainer=cast(Any, record), layer_cuts=CUTS)
    drawn = source.sample(ONE, IntraPlan())
    # 5 layers, 15 ranges: sample_budget(5, 0.3) = (8, 2) (the training floor)
    assert len(drawn) == 10 and all(s.first in CUTS and s.end in CUTS for s in drawn)
    assert source.estimate(StageSpec(0, 1, ONE, IntraPlan())) is None  # cuts the first layer: nothing trained
    assert source.estimate(StageSpec(1, 4, ONE, IntraPlan())) is None and not seen
    found = source.estimate(StageSpec(2, 6, ONE, IntraPlan()))
    assert found is not None and found.latency_s == pytest.approx(70.0)  # 3 blocks and the head
    assert seen["fit"] == [(s.first, s.end) for s in drawn]
    source.prefetch([StageSpec(a, b, ONE, IntraPlan()) for a, b in all_ranges(6)])
    assert len(source.predicted) == 15  # the ranges of whole layers only
    plan = alpa_dp(source, 6, [ONE], {ONE: [IntraPlan()]}, 2, B, capacity_bytes=1.0).plan
    assert all(s.first in CUTS for s in plan.stages)


@pytest.mark.parametrize("cuts", [(0, 2, 5), (1, 6), (0, 3, 3, 6), (0, 7)])
def test_bad_layer_cuts_are_refused(cuts):
    with pytest.raises(ValueError, match="layer_cuts"):
        PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 0.3,  # type: ignore[arg-type]
                          layer_cuts=cuts)


def test_search_settings_name_the_layerings_and_samplers_of_the_predtop_source():
    from trainsim.search.predtop.costs import SAMPLERS
    from trainsim.search.predtop.experiment import LAYERINGS
    from trainsim.search.stage_search import PREDTOP_LAYERS, PREDTOP_SAMPLERS

    assert set(PREDTOP_LAYERS) == set(LAYERINGS) and set(PREDTOP_SAMPLERS) == set(SAMPLERS)


def test_cost_detail_counts_the_meshes_fitted_and_measured_whole():
    source = PredTopStageCosts(FunctionStageCosts(truth), FunctionStageCosts(truth), RangeDags(), 6, 0.3,  # type: ignore[arg-type]
                               seed=0, trainer=cast(Any, fit_kind_sum), usable=usable_on_two_devices())
    alpa_dp(source, 6, [ONE, TWO], {ONE: [IntraPlan()], TWO: [IntraPlan(1, 2)]}, 2, B, capacity_bytes=1.0)
    detail = source.cost_detail()
    assert detail["meshes_trained"] == 1 and detail["meshes_measured_whole"] == 1  # ONE fitted, TWO: [0,6) only
    trained = sum(role == "train" for role in source.roles(ONE, IntraPlan()).values())  # the stub's epochs_run
    assert trained > 0 and detail["epochs_run"] == {f"{ONE.describe()}/{IntraPlan().describe()}": trained}
    assert source.profiled_configurations == 9 + 1
