"""One rank of a measured DLRM iteration with sharded embedding tables over torch.distributed (gloo on the CPU):
plain torch collectives (torchrec does not install here). The program order is the one
compile.lower_sharded_dlrm models, so measured and predicted iterations do the same work:

  index all-to-all (async) | bottom MLP fwd -> wait indices -> lookups fwd of this rank's pieces (global batch)
  -> pooled all-to-all -> interaction + top MLP fwd + loss -> their bwd -> pooled-gradient all-to-all (async)
  | bottom MLP bwd -> dense-gradient all-reduce (async) | wait pooled gradients -> lookups bwd + sparse SGD
  -> wait all-reduce -> dense SGD step.

Pieces: table-wise, column-wise, row-wise (a row block gets the indices that fall in it, renumbered) and
data-parallel (local batch; its gradient joins the all-reduce densely). A barrier opens every iteration (Lin et
al. Sec. IV: "a barrier at the beginning of each batch"); each rank records its iteration time and the start
and end of every step above (a per-rank trace of the ops, on its own clock since the barrier), and the thread
CPU time of every step (CLOCK_THREAD_CPUTIME_ID, time.thread_time): with one torch thread the rank's compute runs
on this thread, so its CPU time is the work of the step without the time the thread waited for a core that other
processes held, which a wall-clock span on a loaded host includes. A collective's thread CPU time is only its
host-side packing: gloo moves the data on its own threads, and the wait is off-CPU. Each span also records the
minor page faults the thread took in it (getrusage(RUSAGE_THREAD)): a fresh multi-megabyte buffer (the sparse
gradient of a lookup's backward) faults its pages in on first touch, which its thread CPU time includes; with the
harness's allocator policy (measure.allocator, "keep") freed buffers are reused, so after a few warm-up
iterations the spans fault no more. Given probes (measure.dlrm_probe), a rank times each just before the barrier
that opens an iteration and just after its last step, outside the iteration's timing, for the phase
normalisation of measure.dlrm_phase (no probe between the spans: it would sit inside the windows where the
asynchronous collectives overlap the compute, and change the iteration it measures).
"""

import itertools
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from trainsim.embedding.indices import popularity_cdf, sample_batch
from trainsim.embedding.sharding import ShardingPlan, ShardPiece
from trainsim.embedding.tables import Table

LR = 0.01


class _Clock:
    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.events: list[tuple[str, float, float]] = []
        self.cpu_s: list[float] = []  # thread CPU seconds of each event
        self.faults: list[int] = []  # minor page faults of the thread in each event
        self._cpu_mark = time.thread_time()
        self._fault_mark = _thread_faults()

    def span(self, name: str, start: float) -> float:
        end = time.perf_counter()
        cpu = time.thread_time()
        self.events.append((name, start - self.origin, end - self.origin))
        self.cpu_s.append(cpu - self._cpu_mark)
        self._cpu_mark = cpu
        faults = _thread_faults()
        self.faults.append(faults - self._fault_mark)
        self._fault_mark = faults
        return end


def _thread_faults() -> int:
    """Minor page faults of the calling thread so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def dense_mlp(torch: Any, widths: list[int], sigmoid_last: bool) -> Any:
    """Linear layers of `widths` with a ReLU after each (none after the last where the loss applies the sigmoid)."""
    layers: list[Any] = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2 or not sigmoid_last:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _batch(tables: tuple[Table, ...], batch: int, seed: int, cdfs: dict[int, Any]) -> dict[int, tuple[Any, Any]]:
    rng = np.random.default_rng(seed)
    return {t.index: sample_batch(t, batch, rng, cdfs.get(t.index)) for t in tables}


def _piece_input(piece: ShardPiece, group: tuple[int, ...], lengths: Any, indices: Any) -> tuple[Any, Any]:
    """The part of one rank's (lengths, indices) of piece.table that this piece looks up (row blocks keep the
    indices in their block, renumbered from 0); group: the ranks of the table's blocks, in block order."""
    if piece.kind not in ("row-wise", "table-row-wise"):
        return lengths, indices
    block = -(-piece.table.rows // len(group))
    lo = group.index(piece.rank) * block
    keep = (indices >= lo) & (indices < lo + piece.rows)
    sample = np.repeat(np.arange(lengths.size), lengths)
    return np.bincount(sample[keep], minlength=lengths.size).astype(np.int64), indices[keep] - lo


def run_config(torch: Any, dist: Any, rank: int, world: int, plan: ShardingPlan, dense: dict[str, Any],
               local_batch: int, iterations: int, warmup: int, seed: int) -> dict[str, Any]:
    """Train `warmup + iterations` iterations of the config; return this rank's times and op spans."""
    steps = config_iterations(torch, dist, rank, world, plan, dense, local_batch, seed, {})
    records = [next(steps) for _ in range(warmup + iterations)][warmup:]
    return {"rank": rank, "records": records}


class IterationHooks:
    """Called on every rank just after the barrier that opens an iteration (start) and just after its last step
    (end); no-ops unless a caller sets them (measure.dlrm_trace: the profiler's step boundaries)."""

    def __init__(self) -> None:
        self.start: Callable[[], None] = _nothing
        self.end: Callable[[], None] = _nothing

    def clear(self) -> None:
        """Back to no-ops."""
        self.start = self.end = _nothing


def _nothing() -> None:
    return None


def run_interleaved(torch: Any, dist: Any, rank: int, world: int, configs: list[tuple[ShardingPlan, dict[str, Any],
                    int, int]], iterations: int, warmup: int, probes: dict[str, Any] | None = None,
                    trace_dirs: list[tuple[str, int]] | None = None) -> list[dict[str, Any]]:
    """Several configs (plan, dense, local_batch, seed) trained side by side, one iteration of each in turn
    (round robin), so that a change in the host's load over the measurement falls on all of them alike: what a
    comparison of configs (the sharders of one task) needs on a shared host. One result per config, as
    run_config's. probes: name -> a probe with time_s() (measure.dlrm_probe), timed around every iteration.
    trace_dirs: per config, a folder ("" for none) and a count: that many more iterations, after the measured
    ones, are recorded as this rank's PyTorch execution trace and Kineto trace (measure.dlrm_trace), in the folder
    (one) or in its subfolders t0, t1, ... (more); their wall times come back as the result's traced_s."""
    hooks = [IterationHooks() for _ in configs]
    steps = [config_iterations(torch, dist, rank, world, *config, probes or {}, hook)
             for config, hook in zip(configs, hooks, strict=True)]
    records: list[list[dict[str, Any]]] = [[] for _ in configs]
    for it in range(warmup + iterations):
        for out, step in zip(records, steps, strict=True):
            record = next(step)
            if it >= warmup:
                out.append(record)
    results: list[dict[str, Any]] = [{"rank": rank, "records": out} for out in records]
    for result, step, hook, (folder, count) in zip(results, steps, hooks, trace_dirs or [("", 0)] * len(configs),
                                                   strict=True):
        if folder:
            from trainsim.measure.dlrm_trace import traced_iteration

            result["traced_s"] = [traced_iteration(step, hook, rank, folder if count == 1 else f"{folder}/t{k}",
                                                   dist.barrier)["iteration_s"] for k in range(count)]
    return results


def config_iterations(torch: Any, dist: Any, rank: int, world: int, plan: ShardingPlan, dense: dict[str, Any],
                      local_batch: int, seed: int, probes: dict[str, Any],
                      hooks: IterationHooks | None = None) -> Iterator[dict[str, Any]]:
    """The config's iterations, one per next(): this rank's iteration time and op spans (and, with probes, each
    probe's thread CPU time just before the barrier and just after the last step). The model and tables are
    built on the first next() and live as long as the iterator. hooks: called after the barrier and after the
    last step of every iteration (IterationHooks)."""
    hooks = hooks or IterationHooks()
    torch.manual_seed(seed)
    groups = {s.table.index: s.ranks for s in plan.shards}
    tables = tuple(s.table for s in plan.shards)
    all_pieces = plan.pieces(local_batch)
    mine = all_pieces[rank]
    bags = [torch.nn.EmbeddingBag(p.rows, p.dim, mode="sum", sparse=True) for p in mine]
    dim = tables[0].dim
    bottom = dense_mlp(torch, [dense["dense_features"], *dense["bottom_mlp"]], False)
    features = len(tables) + 1
    top = dense_mlp(torch, [features * (features - 1) // 2 + dim, *dense["top_mlp"]], True)
    dense_params = list(bottom.parameters()) + list(top.parameters())
    cdfs = {t.index: popularity_cdf(t.rows, t.zipf_alpha) for t in tables if t.zipf_alpha}
    # pooled values each rank sends per sample: its non-data-parallel pieces, in plan order
    send_dims = [sum(p.dim for p in pieces if p.kind != "data-parallel") for pieces in all_pieces]
    lower = torch.tril_indices(features, features, offset=-1)
    for it in itertools.count():
        batches = [_batch(tables, local_batch, seed * 1_000_003 + it * 1009 + r, cdfs) for r in range(world)]
        dense_x = torch.randn(local_batch, dense["dense_features"])
        labels = torch.randint(0, 2, (local_batch, 1)).float()
        before = {name: probe.time_s() for name, probe in probes.items()}
        dist.barrier()
        hooks.start()
        clock = _Clock()
        t = time.perf_counter()
        # index all-to-all: every rank's lengths + indices for the pieces each rank looks up
        send, splits = [], []
        for q in range(world):
            parts = []
            for p in all_pieces[q]:
                if p.kind == "data-parallel":
                    continue
                lengths, indices = _piece_input(p, groups[p.table.index], *batches[rank][p.table.index])
                parts += [lengths, indices]
            flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            send.append(flat)
            splits.append(flat.size)
        recv_splits = []
        for p_rank in range(world):
            size = 0
            for p in mine:
                if p.kind == "data-parallel":
                    continue
                lengths, indices = _piece_input(p, groups[p.table.index], *batches[p_rank][p.table.index])
                size += lengths.size + indices.size
            recv_splits.append(size)
        send_t = torch.from_numpy(np.concatenate(send))
        recv_t = torch.empty(sum(recv_splits), dtype=torch.int64)
        work = dist.all_to_all_single(recv_t, send_t, recv_splits, splits, async_op=True)
        t = clock.span("index-a2a launch", t)
        bottom_out = bottom(dense_x)
        t = clock.span("bottom_mlp fwd", t)
        work.wait()
        t = clock.span("index-a2a wait", t)
        # lookups: each piece over the samples of every rank it serves
        chunks = list(torch.split(recv_t, recv_splits))
        cursor = [0] * world
        outputs = []
        for p, bag in zip(mine, bags, strict=True):
            if p.kind == "data-parallel":
                lengths, indices = batches[rank][p.table.index]
                idx, lens = torch.from_numpy(indices), torch.from_numpy(lengths)
            else:
                lens_parts, idx_parts = [], []
                for q in range(world):
                    n = local_batch
                    lens_q = chunks[q][cursor[q]:cursor[q] + n]
                    k = int(lens_q.sum())
                    idx_parts.append(chunks[q][cursor[q] + n:cursor[q] + n + k])
                    lens_parts.append(lens_q)
                    cursor[q] += n + k
                idx, lens = torch.cat(idx_parts), torch.cat(lens_parts)
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens, 0)[:-1]])
            outputs.append(bag(idx, offsets))
        t = clock.span("embeddings fwd", t)
        # pooled all-to-all: rows of my samples' pooled values to their ranks
        sharded = [o for p, o in zip(mine, outputs, strict=True) if p.kind != "data-parallel"]
        with torch.no_grad():
            pieces_out = torch.cat(sharded, 1) if sharded else torch.zeros(world * local_batch, 0)
            send_pooled = pieces_out.reshape(world, local_batch, -1).reshape(-1).contiguous()
            recv_pooled = torch.empty(local_batch * sum(send_dims))
            dist.all_to_all_single(recv_pooled, send_pooled, [local_batch * d for d in send_dims],
                                   [local_batch * send_dims[rank]] * world)
        t = clock.span("pooled-a2a-fwd", t)
        received = recv_pooled.requires_grad_(True)
        bottom_leaf = bottom_out.detach().requires_grad_(True)
        pooled = _assemble(torch, plan, all_pieces, received, local_batch, send_dims, outputs, mine, rank)
        stacked = torch.stack([bottom_leaf, *pooled], 1)
        z = torch.bmm(stacked, stacked.transpose(1, 2))[:, lower[0], lower[1]]
        logits = top(torch.cat([bottom_leaf, z], 1))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        t = clock.span("top_mlp fwd", t)
        loss.backward()
        t = clock.span("top_mlp bwd", t)
        grad_back = torch.empty(world * local_batch * send_dims[rank])
        recv_grad = received.grad if received.grad is not None else torch.zeros_like(received)
        work_grad = dist.all_to_all_single(grad_back, recv_grad.contiguous(), [local_batch * send_dims[rank]] * world,
                                           [local_batch * d for d in send_dims], async_op=True)
        t = clock.span("pooled-a2a-bwd launch", t)
        bottom_out.backward(bottom_leaf.grad)
        t = clock.span("bottom_mlp bwd", t)
        dp_bags = [b for p, b in zip(mine, bags, strict=True) if p.kind == "data-parallel"]
        flat = torch.cat([q.grad.reshape(-1) for q in dense_params]
                         + [b.weight.grad.to_dense().reshape(-1) for b in dp_bags if b.weight.grad is not None])
        work_ar = dist.all_reduce(flat, async_op=True)
        t = clock.span("grad-allreduce launch", t)
        work_grad.wait()
        t = clock.span("pooled-a2a-bwd wait", t)
        grads = grad_back.reshape(world, local_batch, -1).reshape(world * local_batch, -1) if sharded else None
        col = 0
        for p, out, bag in zip(mine, outputs, bags, strict=True):
            if p.kind == "data-parallel" or grads is None:
                continue
            out.backward(grads[:, col:col + p.dim])
            col += p.dim
            with torch.no_grad():
                bag.weight.add_(bag.weight.grad, alpha=-LR)
            bag.weight.grad = None
        t = clock.span("embeddings bwd", t)
        work_ar.wait()
        t = clock.span("grad-allreduce wait", t)
        with torch.no_grad():
            flat /= world
            offset = 0
            for q in dense_params:
                n = q.numel()
                q.add_(flat[offset:offset + n].view_as(q), alpha=-LR)
                q.grad = None
                offset += n
            for b in dp_bags:
                n = b.weight.numel()
                b.weight.add_(flat[offset:offset + n].view_as(b.weight), alpha=-LR)
                b.weight.grad = None
                offset += n
        clock.span("optimizer step", t)
        hooks.end()
        record = {"iteration_s": clock.events[-1][2], "events": clock.events, "cpu_s": clock.cpu_s,
                  "faults": clock.faults}
        if probes:
            record["probe_s"] = {name: (before[name], probe.time_s()) for name, probe in probes.items()}
        yield record


def _assemble(torch: Any, plan: ShardingPlan, all_pieces: list[list[ShardPiece]], received: Any, batch: int,
              send_dims: list[int], outputs: list[Any], mine: list[ShardPiece], rank: int) -> list[Any]:
    """Per table (plan order), this rank's samples' pooled values: column blocks concatenated, row blocks summed,
    data-parallel tables from the local lookup."""
    by_source = torch.split(received, [batch * d for d in send_dims])
    per_table: dict[int, list[tuple[str, Any]]] = {}
    for q, pieces in enumerate(all_pieces):
        block = by_source[q].view(batch, send_dims[q]) if send_dims[q] else None
        col = 0
        for p in pieces:
            if p.kind == "data-parallel":
                continue
            assert block is not None
            per_table.setdefault(p.table.index, []).append((p.kind, block[:, col:col + p.dim]))
            col += p.dim
    dp_out = {p.table.index: o for p, o in zip(mine, outputs, strict=True) if p.kind == "data-parallel"}
    out = []
    for shard in plan.shards:
        index = shard.table.index
        if index in dp_out:
            out.append(dp_out[index])
            continue
        parts = per_table[index]
        if parts[0][0] == "column-wise":
            out.append(torch.cat([v for _, v in parts], 1))
        else:
            total = parts[0][1]
            for _, v in parts[1:]:
                total = total + v
            out.append(total)
    return out
