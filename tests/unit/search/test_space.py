"""search.space: the enumerated plans; trainsim.divisors: divisors from the prime factorisation."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.catalog.loader import load_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.divisors import divisors, prime_factors
from trainsim.errors import ConfigError
from trainsim.search.space import PipelineSplit, SearchSpace, enumerate_plans, pipeline_splits, plan_grid, uneven_split
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stages import split_blocks


def _divisors_by_trial(n: int) -> list[int]:
    """n's divisors by trial division up to sqrt(n), each found d with its partner n // d (no factorisation)."""
    return sorted({d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)})


def test_divisors_match_the_definition_on_small_numbers() -> None:
    for n in [1, 2, 12, 97, 360, 5040]:
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
    rng = random.Random(12)
    for n in [2**20, *(rng.randint(1, 10**6) for _ in range(200))]:
        assert divisors(n) == _divisors_by_trial(n), n


@pytest.mark.parametrize(("n", "count"), [(10**16, 289), (10**30, 961), (1_000_003**2, 3), (2**40 - 87, 2)])
def test_divisors_of_huge_numbers(n: int, count: int) -> None:
    found = divisors(n)
    assert len(found) == count and found[0] == 1 and found[-1] == n and all(n % d == 0 for d in found)


def test_prime_factors_multiply_back() -> None:
    n = 1_099_511_627_689 * 1_000_003 * 2**5 * 3
    factors = prime_factors(n)
    product = 1
    for prime, power in factors.items():
        product *= prime**power
    assert product == n and factors[1_000_003] == 1 and factors[2] == 5


def test_enumerated_plans_are_the_validated_specs() -> None:
    """enumerate_plans validates one spec per (tp, pp, vpp, mb, sp) and copies its recompute and ZeRO variants:
    each copy equals the spec validation makes from the same settings, field by field."""
    model = parse_model({"name": "tiny", "num_layers": 8, "hidden": 64, "ffn_hidden": 256, "num_heads": 4,
                         "vocab": 100})
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=32, seq_len=128, max_micro_batch=2, recomputes=("full", "none"),
                        zero_stages=(3, 1))
    plans = list(enumerate_plans(model, cluster, space))
    assert {(plan.recompute, plan.zero) for plan in plans} == {("full", 3), ("full", 1), ("none", 3), ("none", 1)}
    for plan in plans:
        validated = ParallelSpec.model_validate(plan.model_dump())
        assert plan == validated and plan.model_dump() == validated.model_dump()


def test_the_plan_grid_is_the_enumeration_with_its_columns() -> None:
    """plan_grid gives enumerate_plans' plans in its order; each plan's variant is its (recompute, ZeRO), and the
    plans of one base differ in nothing else; take keeps the columns of the plans asked for, in that order."""
    model = parse_model({"name": "tiny", "num_layers": 8, "hidden": 64, "ffn_hidden": 256, "num_heads": 4,
                         "vocab": 100})
    cluster = load_cluster("dgx-a100-80gb").with_num_gpus(16)
    space = SearchSpace(global_batch=32, seq_len=128, max_micro_batch=2, recomputes=("full", "none"),
                        zero_stages=(3, 1))
    plans, columns = plan_grid(model, cluster, space)
    assert plans == list(enumerate_plans(model, cluster, space))
    assert len(columns.base) == len(columns.variant) == len(plans)
    assert columns.variants == (("full", 3), ("full", 1), ("none", 3), ("none", 1))
    bases: dict[int, dict[str, object]] = {}
    for plan, base, variant in zip(plans, columns.base, columns.variant, strict=True):
        assert (plan.recompute, plan.zero) == columns.variants[variant]
        rest = plan.model_dump(exclude={"recompute", "zero"})
        assert bases.setdefault(base, rest) == rest
    assert len(bases) == len(plans) // 4 and sorted(bases) == list(range(len(bases)))
    assert len({str(rest) for rest in bases.values()}) == len(bases)  # one base per settings
    taken = columns.take([5, 0, 9])
    assert taken.base == [columns.base[5], columns.base[0], columns.base[9]]
    assert taken.variant == [columns.variant[5], columns.variant[0], columns.variant[9]]


def test_an_unknown_recompute_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="recompute"):
        SearchSpace(global_batch=8, recomputes=("partial",))  # type: ignore[arg-type]


def megatron_core_accepts(num_layers: int, split: PipelineSplit) -> bool:
    """TransformerConfig.__post_init__'s checks of an uneven split (megatron/core/transformer/transformer_config.py,
    megatron-core 0.16.1), written out again: first / last stage layers each > 0 and a multiple of vpp, the middle
    ranks' layers divisible by their count and each rank's by vpp, middle ranks iff middle layers; or the embedding
    and loss counted, the counted layers divisible by pp and each rank's by vpp; never both."""
    pp, vpp = split.pp, split.vpp
    fixed = [count for count in (split.first_stage_layers, split.last_stage_layers) if count]
    if fixed and (split.embedding_in_split or split.loss_in_split):
        return False
    if fixed:
        if any(count % vpp for count in fixed):
            return False
        middle_layers, middle_ranks = num_layers - sum(fixed), pp - len(fixed)
        if bool(middle_layers) != bool(middle_ranks):
            return False
        return not middle_ranks or (middle_layers % middle_ranks == 0 and middle_layers // middle_ranks % vpp == 0)
    counted = num_layers + split.embedding_in_split + split.loss_in_split
    return counted % pp == 0 and counted // pp % vpp == 0


def test_uneven_splits_by_hand() -> None:
    """DeepSeek-V3's 61 layers: pp 2 counts the loss (31 layers a rank), pp 4, 8 and 16 fix the first and last
    ranks (ceil(61 / pp) on each middle rank, the remainder shared), pp 32 has none (a middle rank's 2 leave 1);
    80 layers on pp 32 none (3 a middle rank is more than 80); an even split is not an uneven one."""
    assert uneven_split(61, 2, 1) == PipelineSplit(2, 1, loss_in_split=True)
    assert uneven_split(61, 4, 1) == PipelineSplit(4, 1, first_stage_layers=14, last_stage_layers=15)
    assert uneven_split(61, 8, 1) == PipelineSplit(8, 1, first_stage_layers=6, last_stage_layers=7)
    assert uneven_split(61, 16, 1) == PipelineSplit(16, 1, first_stage_layers=2, last_stage_layers=3)
    assert uneven_split(61, 32, 1) is None
    assert uneven_split(61, 4, 2) is None  # 14 and 15 blocks: 15 is no multiple of vpp 2
    assert uneven_split(62, 4, 2) == PipelineSplit(4, 2, embedding_in_split=True, loss_in_split=True)  # 64 / 4 = 16
    assert uneven_split(80, 32, 1) is None
    assert uneven_split(80, 4, 1) is None
    assert uneven_split(126, 8, 4) == PipelineSplit(8, 4, embedding_in_split=True, loss_in_split=True)  # 128 / 8


def test_pipeline_splits_add_only_pp_of_a_whole_dp() -> None:
    """61 layers on 2,048 GPUs at tp 1: the even pp 1 and 61 and the uneven 2, 4, 8, 16 (the divisors of 2,048
    with a split); 80 layers on 1,024: the even splits alone (no divisor of 1,024 splits 80 unevenly)."""
    deepseek = parse_model({"name": "l61", "num_layers": 61, "hidden": 64, "ffn_hidden": 256, "num_heads": 4,
                            "vocab": 100})
    assert [[(s.pp, s.vpp) for s in splits] for splits in pipeline_splits(deepseek, 2048, 8)] == [
        [(1, 1)], [(2, 1)], [(4, 1)], [(8, 1)], [(16, 1)], [(61, 1)]]
    llama = parse_model({"name": "l80", "num_layers": 80, "hidden": 64, "ffn_hidden": 256, "num_heads": 4,
                         "vocab": 100})
    splits = pipeline_splits(llama, 1024, 8)
    assert [s[0].pp for s in splits] == divisors(80)
    assert all(s.first_stage_layers == s.last_stage_layers == 0 and not s.embedding_in_split and not s.loss_in_split
               for pp_splits in splits for s in pp_splits)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(2, 64), st.integers(1, 8))
def test_every_uneven_split_is_megatron_cores_and_splits_the_blocks(num_layers: int, pp: int, vpp: int) -> None:
    split = uneven_split(num_layers, pp, vpp)
    if num_layers % (pp * vpp) == 0:
        assert split is None
    if split is None:
        return
    assert (split.pp, split.vpp) == (pp, vpp)
    assert megatron_core_accepts(num_layers, split)
    blocks = split_blocks(num_layers, pp, vpp, first=split.first_stage_layers, last=split.last_stage_layers,
                          embedding=split.embedding_in_split, loss=split.loss_in_split)
    assert sum(blocks) == num_layers and len(blocks) == pp * vpp
    if split.first_stage_layers:  # the first and last ranks hold no more than a middle rank
        per_rank = [sum(blocks[chunk * pp + rank] for chunk in range(vpp)) for rank in range(pp)]
        assert max(per_rank[0], per_rank[-1]) <= max(per_rank[1:-1], default=num_layers)
