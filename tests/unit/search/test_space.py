"""search.space: divisors from the prime factorisation; the enumerated plans."""

import random

import pytest

from trainsim.catalog.loader import load_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.errors import ConfigError
from trainsim.search.space import SearchSpace, divisors, enumerate_plans, prime_factors
from trainsim.strategy.parallel import ParallelSpec


def test_divisors_match_the_definition_on_small_numbers() -> None:
    rng = random.Random(12)
    for n in [1, 2, 12, 97, 360, 2**20, *(rng.randint(1, 10**6) for _ in range(200))]:
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n


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


def test_an_unknown_recompute_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="recompute"):
        SearchSpace(global_batch=8, recomputes=("partial",))  # type: ignore[arg-type]
