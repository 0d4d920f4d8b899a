"""The overlap factor gamma measured as Proteus measures it (Sec. VI-C): "we profile the speeds of backward pass
with and without overlapping in data parallel training and gamma is set to the increase ratio".

`world_size` local processes join one gloo group and train the job's transformer (measure.model) data-parallel
on one micro-batch each. Per repeat, after a barrier, each times its backward pass twice: plain (gradients
synced after it, outside the timed window), and overlapped (each gradient's all-reduce launched asynchronously
from its accumulate hook, as PyTorch DDP does, the backward timed until it returns, the all-reduces awaited
after). gamma = median(overlapped) / median(plain) - 1, at least 0, the slowest rank's per repeat.
"""

import contextlib
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from trainsim.errors import ConfigError
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.profile.collectives import BACKEND, join_ranks, next_rank_message, start_ranks


@dataclass(frozen=True, slots=True)
class OverlapMeasurement:
    plain_backward_s: float  # median over repeats of the slowest rank
    overlapped_backward_s: float
    world_size: int
    repeats: int

    @property
    def gamma(self) -> float:
        return max(0.0, self.overlapped_backward_s / self.plain_backward_s - 1.0)


def _worker(rank: int, world_size: int, port: int, results: Any, spec: TransformerSpec, micro_batch: int,
            seq_len: int, warmup: int, repeats: int, threads: int, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.measure.model import build_model, lm_loss

    torch.set_num_threads(threads)
    try:
        dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        torch.manual_seed(rank)
        model = build_model(spec)
        tokens = torch.randint(0, spec.vocab, (micro_batch, seq_len))
        works: list[Any] = []
        overlapping = [False]

        def launch(param: Any) -> None:
            if overlapping[0] and param.grad is not None:
                works.append(dist.all_reduce(param.grad, async_op=True))

        for param in model.parameters():
            param.register_post_accumulate_grad_hook(launch)
        samples: dict[bool, list[float]] = {False: [], True: []}
        for index in range(warmup + repeats):
            for overlapped in (False, True):
                model.zero_grad(set_to_none=True)
                loss = lm_loss(model(tokens), tokens)
                overlapping[0] = overlapped
                dist.barrier()
                start = time.perf_counter()
                loss.backward()
                elapsed = time.perf_counter() - start
                overlapping[0] = False
                if overlapped:
                    for work in works:
                        work.wait()
                    works.clear()
                else:
                    for param in model.parameters():
                        if param.grad is not None:
                            dist.all_reduce(param.grad)
                if index >= warmup:
                    samples[overlapped].append(elapsed)
        slowest = torch.tensor([samples[False], samples[True]], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            results.put(("result", slowest[0].tolist(), slowest[1].tolist()))
    except Exception as exc:  # reported to the parent, which decides
        results.put(("error", rank, f"{type(exc).__name__}: {exc}"))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def measure_overlap(model: ModelSpec, *, micro_batch: int, seq_len: int, world_size: int = 2, warmup: int = 2,
                    repeats: int = 10, threads: int = 1, timeout_s: float = 600.0) -> OverlapMeasurement:
    """Time the backward pass with and without overlapping gradient all-reduces on `world_size` local ranks."""
    if not isinstance(model, TransformerSpec):
        raise ConfigError("model", model.name, "the overlap measurement trains a transformer (measure.model)")
    for name, value in (("micro_batch", micro_batch), ("seq_len", seq_len), ("repeats", repeats),
                        ("threads", threads)):
        if value < 1:
            raise ConfigError(name, value, "must be a positive integer")
    if world_size < 2:
        raise ConfigError("world_size", world_size, "must be at least 2 (gradients to all-reduce)")
    results, procs = start_ranks(_worker, world_size, model, micro_batch, seq_len, max(0, warmup), repeats, threads,
                                 timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        _, plain, overlapped = next_rank_message(results, procs, deadline, timeout_s, "overlap measurement")
        return OverlapMeasurement(statistics.median(plain), statistics.median(overlapped), world_size, repeats)
    finally:
        join_ranks(procs)
