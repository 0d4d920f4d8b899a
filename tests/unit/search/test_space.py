"""search.space: the enumerated plans; trainsim.divisors: divisors from the prime factorisation."""

import math
import random

import pytest

from trainsim.catalog.loader import load_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.divisors import divisors, prime_factors
from trainsim.errors import ConfigError
from trainsim.search.space import SearchSpace, enumerate_plans, plan_grid
from trainsim.strategy.parallel import ParallelSpec


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
