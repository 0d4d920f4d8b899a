"""search.space: divisors from the prime factorisation."""

import random

import pytest

from trainsim.search.space import divisors, prime_factors


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
