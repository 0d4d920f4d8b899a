"""What one reshard module of a per-op tp plan costs a gloo rank beyond its collective's transfer: the modules
measure/hidden_splits.py and measure/op_splits.py run (docs/strategy-tree.md, "The reshard modules' host cost").

On 2 local gloo ranks (one intra-op thread each, as `trainsim measure` runs them), per variant, one forward and
backward on the small GPT's tensors (a [4, 128, 256] fp32 hidden state, a [4, 128, 1] per-token statistic):
the training thread's CPU (time.thread_time) and the process' (time.process_time: gloo's own threads too), the
median over rounds of the mean of `calls` calls, variants taken round robin. The variants:

- bare-*: the collective as one torch.distributed call on a flat tensor, no autograd (what `trainsim profile`'s
  collective microbenchmark times);
- stats-both-ways: a norm's statistic all-reduced forward and its gradient backward (hidden_splits
  _all_reduce_both_ways: split_model's AllReduce over ReduceGradients);
- slice: this rank's half of the features (op_collectives.slice_part: forward a copy, backward an all-gather);
- gather: the halves all-gathered (op_collectives.gather: backward keeps this rank's part);
- dtensor-shard-to-replicate: DTensor.from_local(Shard(-1)).redistribute(Replicate()).to_local(), torch's
  PrepareModuleInput of a norm by features' reader (forward all-gather, backward a reduce-scatter);
- local-*: the same autograd function's forward and backward with no process group call (the local compute).

    flock /tmp/trainsim-timing.lock python scripts/reshard_host_probe.py [--calls 20 --rounds 9]
"""

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

HIDDEN = (4, 128, 256)


def _variants(group: Any, world: int, index: int) -> dict[str, Callable[[], None]]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from trainsim.measure.hidden_splits import _all_reduce_both_ways
    from trainsim.measure.op_collectives import Group, gather, slice_part

    g = Group(group, world, index)
    mesh = init_device_mesh("cpu", (world,))
    whole = torch.randn(*HIDDEN, requires_grad=True)
    part = torch.randn(*HIDDEN[:-1], HIDDEN[-1] // world, requires_grad=True)
    stat = torch.randn(*HIDDEN[:-1], 1, requires_grad=True)
    flat_stat, flat_part = stat.detach().clone(), part.detach().clone()
    parts_out = [torch.empty_like(flat_part) for _ in range(world)]

    def bare_ar() -> None:
        dist.all_reduce(flat_stat, group=group)

    def bare_ag() -> None:
        dist.all_gather(parts_out, flat_part, group=group)

    def stats() -> None:
        _all_reduce_both_ways(stat, g).sum().backward()

    def sliced() -> None:
        slice_part(whole, g, -1).sum().backward()

    def gathered() -> None:
        gather(part, g, -1).sum().backward()

    def dtensor() -> None:
        DTensor.from_local(part, mesh, [Shard(-1)], run_check=False).redistribute(
            mesh, [Replicate()]).to_local().sum().backward()

    def local_stats() -> None:
        (stat * 1.0).sum().backward()

    def local_slice() -> None:
        whole.chunk(world, dim=-1)[index].contiguous().sum().backward()

    return {"bare-all-reduce-stat": bare_ar, "bare-all-gather-half": bare_ag, "stats-both-ways": stats,
            "slice": sliced, "gather": gathered, "dtensor-shard-to-replicate": dtensor,
            "local-stat": local_stats, "local-slice": local_slice}


def _worker(rank: int, world: int, port: int, calls: int, rounds: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        variants = _variants(dist.group.WORLD, world, rank)
        thread: dict[str, list[float]] = {name: [] for name in variants}
        process: dict[str, list[float]] = {name: [] for name in variants}
        for warm in variants.values():
            warm()
        for _ in range(rounds):
            for name, fn in variants.items():
                dist.barrier()
                t0, p0 = time.thread_time(), time.process_time()
                for _ in range(calls):
                    fn()
                thread[name].append((time.thread_time() - t0) / calls)
                process[name].append((time.process_time() - p0) / calls)
        queue.put((rank, {name: (statistics.median(thread[name]), statistics.median(process[name]))
                          for name in variants}))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    from trainsim.measure.launch import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, args.world_size, port, args.calls, args.rounds, queue))
             for r in range(args.world_size)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join()
    load = os.getloadavg()
    table = {name: {f"rank{r}": {"thread_us": round(results[r][name][0] * 1e6, 1),
                                 "process_us": round(results[r][name][1] * 1e6, 1)} for r in sorted(results)}
             for name in results[0]}
    print(json.dumps({"load_average": [round(x, 2) for x in load], "calls": args.calls, "rounds": args.rounds,
                      "us_per_forward_and_backward": table}, indent=1))


if __name__ == "__main__":
    main()
