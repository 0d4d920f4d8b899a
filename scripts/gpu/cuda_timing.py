"""CUDA-event timing shared by the GPU scripts beside it (run as `python3 scripts/gpu/NAME.py`, so this folder is
on the import path)."""

import statistics
from collections.abc import Callable


def timed_ms(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median milliseconds of `repeats` calls of fn, each between two CUDA events, after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
