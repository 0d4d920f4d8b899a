"""The cyclic garbage collector paused while a search builds and prices its plans, or a simulation compiles and
runs its tasks.

A search makes tens of thousands of objects that hold no reference cycles (specs, jobs, keys, tuples, arrays):
reference counting frees them, and the cyclic collector only walks them, again and again as they pile up, and
in its full passes the whole heap besides. Paused, the LLaMA-3.1-70B search on 1,024 H100 made 1.12x the plans
per CPU second and a cold grid 1.02-1.03x (benchmarks/bench_search.py; docs/speed.md), with the same figures:
the collector frees only unreachable cycles, it changes no value. SimEstimator.run pauses it for the same reason
(hundreds of thousands of acyclic task objects).
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The block runs with the cyclic collector off; afterwards it is as the caller had it (on or off)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
