"""Divisors of positive integers, from their prime factorisation: one helper for every enumeration of whole
splits (the search's axes, the stage planner's meshes)."""

import math


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending, from its prime factors (a loop to sqrt(n) takes 26 s at n = 10^16 and
    never ends at 10^30; factorising takes microseconds)."""
    found = [1]
    for prime, power in prime_factors(n).items():
        found = [d * prime**k for d in found for k in range(power + 1)]
    return sorted(found)


def prime_factors(n: int) -> dict[int, int]:
    """n's prime factorisation {prime: power}: trial division by small primes, then Pollard's rho (Brent's
    variant; Pollard 1975, Brent 1980) with a Miller-Rabin test on what remains."""
    factors: dict[int, int] = {}
    for prime in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        while n % prime == 0:
            factors[prime] = factors.get(prime, 0) + 1
            n //= prime
    pending = [n] if n > 1 else []
    while pending:
        m = pending.pop()
        if _is_prime(m):
            factors[m] = factors.get(m, 0) + 1
            continue
        d = _rho(m)
        pending += [d, m // d]
    return factors


_WITNESSES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # deterministic below 3.3e24 (Sorenson & Webster 2015)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n in _WITNESSES:
        return True
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A nontrivial factor of the odd composite n (deterministic: the constants are tried in order)."""
    for c in range(1, n):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise AssertionError(f"no factor found for {n}")
