"""CUDA-event timing shared by the GPU scripts beside it (run as `python3 scripts/gpu/NAME.py`, so this folder is
on the import path)."""

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path


def timing_arguments() -> argparse.Namespace:
    """--out (the JSON file to write), --warmup and --repeats (per timed case), as every script here takes them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    return parser.parse_args()


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
