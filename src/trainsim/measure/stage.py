"""Measure pipeline stages alone: one micro-batch's forward and backward through units [first, end) of a
transformer's layer chain, on 1 or more local ranks (gloo), for the stage planners (search.stage_dp).

A stage is built from measure.model's pieces (the embedding with the first unit, the final norm and head with
the last); a mixture-of-experts block replaces the MLP of every moe_every-th block with measure.model.MoE (top-k
gating, GShard-style, Lepikhin et al. 2020, sec. 2.2, experts run as dense loops over their tokens), built after
the dense chunk from the global generator (the stage databases and DAGs in the repo were made so). The stage's input
is the previous stage's activation (random, requires grad: backward computes its gradient, as a pipeline
stage sends it back); a stage without the head runs backward from a random output gradient, one with it from
the cross-entropy loss.

Intra plans: dp splits the micro-batch over the ranks (the once-per-iteration gradient reduction is not part of
a micro-batch's latency, as in Alpa's stage profiles); tp shards the blocks and head with
measure.parallelize.apply_tp (dense blocks only). Timing: `warmup` untimed, then the median of `iterations`
runs, each timed by the slowest rank (barriers around it), in CPU time by default (time_stage: this machine is
shared, and wall time drifted with its load) and in wall time for tp. Memory: the model states (fp32 weights, gradients
and Adam's two moments: 16 bytes per parameter, torch.optim.Adam) and the bytes autograd saves for backward
(saved-tensor hooks, distinct storages), both measured on the module.

Imported only where torch is available.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.launch import free_port
from trainsim.measure.model import Block, ChunkPlan, MoE, TransformerChunk, build_chunk
from trainsim.measure.parallelize import _local
from trainsim.measure.phase import ReferenceProbe
from trainsim.strategy.stage_plan import StageSpec, unit_kind

ADAM_FP32_BYTES_PER_PARAM = 16  # fp32 weight + gradient + exp_avg + exp_avg_sq (torch.optim.Adam)


def build_stage(model: TransformerSpec, first: int, end: int, seed: int = 0) -> TransformerChunk:
    """Units [first, end) as a module: blocks keep their global index, MoE blocks get the MoE MLP."""
    last = model.num_layers + 1
    blocks = [u - 1 for u in range(max(first, 1), min(end, last))]
    plan = ChunkPlan(blocks[0] if blocks else 0, blocks[-1] + 1 if blocks else 0, first == 0, end == last + 1)
    torch.manual_seed(seed)
    chunk = build_chunk(model, plan, "none", seed)
    for index, block in chunk.layers.items():
        if unit_kind(model, int(index) + 1) == "moe_block":
            assert isinstance(block, Block)
            block.mlp = MoE(model)
    return chunk


@dataclass(frozen=True, slots=True)
class StageTiming:
    latency_s: float
    state_bytes: float
    activation_bytes: float
    samples_s: tuple[float, ...]
    # with a ReferenceProbe: the probe's thread CPU time around each timed run (the mean of the one just before
    # and the one just after, the slowest rank's), for measure.phase.phase_normalised_s; else empty
    reference_s: tuple[float, ...] = ()


def _saved_bytes(step: Any) -> tuple[Any, float]:
    """Run `step` (a forward only: its graph cannot be run backward) under saved-tensor hooks: its result and the
    bytes of the distinct storages autograd saved. NB: the hook keeps no reference to what it is given; a hook
    returning the tensor itself makes a cycle (a saved output -> its grad_fn -> the output) that Python's
    collector cannot see, and every stage measured leaked its forward's activations (found on an H100)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> None:
        if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter):
            storage = _local(t).untyped_storage()  # a DTensor's shard on this rank
            seen[storage.data_ptr()] = storage.nbytes()

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("a graph recorded to count saved bytes cannot be run backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        result = step()
    return result, float(sum(seen.values()))


class _StageRunner:
    """One stage's module, inputs and step on this rank."""

    def __init__(self, model: TransformerSpec, stage: StageSpec, micro_batch: int, seq_len: int, seed: int,
                 group_tp: Any = None, device: str = "cpu") -> None:
        self.model = model
        with torch.device(device):
            self.module = build_stage(model, stage.first, stage.end, seed)
        self.has_head = stage.end == model.num_layers + 2
        self.has_embedding = stage.first == 0
        self.tp_mesh = group_tp
        if group_tp is not None:
            from trainsim.measure.parallelize import apply_tp

            apply_tp(self.module, model, group_tp, stage.intra.sp)
        gen = torch.Generator().manual_seed(seed)
        local = micro_batch // stage.intra.dp
        if self.has_embedding:
            self.input = torch.randint(0, model.vocab, (local, seq_len), generator=gen)
        else:
            self.input = torch.randn(local, seq_len, model.hidden, generator=gen)
        self.labels = torch.randint(0, model.vocab, (local, seq_len), generator=gen)
        self.out_grad = torch.randn(local, seq_len, model.hidden, generator=gen)
        self.input, self.labels, self.out_grad = (t.to(device) for t in (self.input, self.labels, self.out_grad))
        self.params = sum(_local(p).numel() for p in self.module.parameters())

    def forward(self) -> torch.Tensor:
        x = self.input if self.has_embedding else self.input.detach().requires_grad_(True)
        out = self.module(x)
        if self.has_head:
            if self.tp_mesh is not None:
                from torch.distributed.tensor.parallel import loss_parallel

                with loss_parallel():
                    loss = F.cross_entropy(out.flatten(0, 1), self.labels.flatten())
                    return loss
            return F.cross_entropy(out.flatten(0, 1), self.labels.flatten())
        return (_local(out) * self.out_grad).sum()

    def step(self) -> float:
        """One forward and backward."""
        for p in self.module.parameters():
            p.grad = None
        loss = self.forward()
        if self.tp_mesh is not None and self.has_head:
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                loss.backward()
        else:
            loss.backward()
        return float(_local(loss.detach()))


CLOCKS = ("cpu", "wall", "cuda")


def time_stage(runner: _StageRunner, warmup: int, iterations: int, group: Any = None,
               clock: str = "cpu", probe: ReferenceProbe | None = None) -> StageTiming:
    """The median over `iterations` of one forward and backward, on the slowest rank. clock "cpu": the
    process's CPU time (time.process_time); "wall": wall-clock time. On a CPU shared with other processes the
    wall clock counts the waits for a core, which drift with the machine's load (measured here: the same block
    2.5x slower minutes later); CPU time does not. Stages whose ranks wait on each other (tp) need "wall".
    "cuda": wall-clock time with the device synchronised before and after the step (a stage on one GPU).
    With a probe, it is timed just before and just after each run (outside the run's timing)."""
    read = time.process_time if clock == "cpu" else time.perf_counter
    sync = torch.cuda.synchronize if clock == "cuda" else (lambda: None)
    for _ in range(warmup):
        runner.step()
    _, saved = _saved_bytes(runner.forward)
    samples, references = [], []
    for _ in range(iterations):
        if group is not None:
            dist.barrier(group)
        before = probe.time_s() if probe is not None else 0.0
        sync()
        start = read()
        runner.step()
        sync()
        elapsed = read() - start
        reference = (before + probe.time_s()) / 2 if probe is not None else 0.0
        if group is not None:
            slowest = torch.tensor([elapsed, reference])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            elapsed, reference = (float(v) for v in slowest.tolist())
        samples.append(elapsed)
        references.append(reference)
    local_params = runner.params
    return StageTiming(statistics.median(samples), float(ADAM_FP32_BYTES_PER_PARAM * local_params), saved,
                       tuple(samples), tuple(references) if probe is not None else ())


def _stage_to_json(stage: StageSpec) -> dict[str, Any]:
    return {"first": stage.first, "end": stage.end, "nodes": stage.mesh.nodes,
            "devices_per_node": stage.mesh.devices_per_node, "tp": stage.intra.tp, "dp": stage.intra.dp,
            "sp": stage.intra.sp}


def _stage_from_json(data: dict[str, Any]) -> StageSpec:
    from trainsim.strategy.stage_plan import IntraPlan, Mesh

    return StageSpec(data["first"], data["end"], Mesh(data["nodes"], data["devices_per_node"]),
                     IntraPlan(data["tp"], data["dp"], data["sp"]))


def measure_stages_local(model: TransformerSpec, stages: list[StageSpec], micro_batch: int, seq_len: int,
                         warmup: int = 2, iterations: int = 5, seed: int = 0, threads: int = 1,
                         clock: str = "cpu", device: str = "cpu", probe: bool = False) -> list[StageTiming]:
    """Stages on one rank (their meshes must be one device), in this process; on a GPU (device "cuda") they
    are timed with the "cuda" clock. probe: time measure.phase's reference probe around each run."""
    torch.set_num_threads(threads)
    reference = ReferenceProbe() if probe else None
    results = []
    for stage in stages:
        if stage.mesh.size != 1:
            raise ValueError("measure_stages_local runs one-device stages; use measure_stages")
        runner = _StageRunner(model, stage, micro_batch, seq_len, seed, device=device)
        results.append(time_stage(runner, warmup, iterations, clock="cuda" if device == "cuda" else clock,
                                  probe=reference))
        del runner  # its module and inputs go before the next stage is built
    return results


def _worker(rank: int, world: int, port: int, payload: dict[str, Any], out_path: str) -> None:
    torch.set_num_threads(payload["threads"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = TransformerSpec.model_validate(payload["model"])
    probe = ReferenceProbe() if payload.get("probe") else None
    results = []
    try:
        for data in payload["stages"]:
            stage = _stage_from_json(data)
            tp_mesh = None
            if stage.intra.tp > 1:
                from torch.distributed.device_mesh import init_device_mesh

                tp_mesh = _TpTopology(init_device_mesh("cpu", (stage.intra.dp, stage.intra.tp),
                                                       mesh_dim_names=("dp", "tp")))
            runner = _StageRunner(model, stage, payload["micro_batch"], payload["seq_len"], payload["seed"], tp_mesh)
            clock = "wall" if stage.intra.tp > 1 else payload["clock"]
            timing = time_stage(runner, payload["warmup"], payload["iterations"], dist.group.WORLD, clock, probe)
            results.append({"latency_s": timing.latency_s, "state_bytes": timing.state_bytes,
                            "activation_bytes": timing.activation_bytes, "samples_s": list(timing.samples_s),
                            "reference_s": list(timing.reference_s)})
    finally:
        if rank == 0:
            Path(out_path).write_text(json.dumps(results))
        dist.destroy_process_group()


@dataclass(frozen=True, slots=True)
class _TpTopology:
    """What apply_tp reads of a measure.parallelize.Topology: the mesh (with a "tp" axis) and the tp rank."""

    mesh: Any

    @property
    def tp_rank(self) -> int:
        return int(self.mesh["tp"].get_local_rank())


def measure_stages(model: TransformerSpec, stages: list[StageSpec], micro_batch: int, seq_len: int,
                   warmup: int = 2, iterations: int = 5, seed: int = 0, threads: int = 1,
                   timeout_s: float = 600.0, clock: str = "cpu", probe: bool = False) -> list[StageTiming]:
    """Stages of one mesh size: in this process for one device, else on mesh-size local gloo ranks. probe: time
    measure.phase's reference probe around each run (StageTiming.reference_s)."""
    if not stages:
        return []
    sizes = {stage.mesh.size for stage in stages}
    if len(sizes) != 1:
        raise ValueError("measure_stages takes stages of one mesh size at a time")
    world = sizes.pop()
    if world == 1:
        return measure_stages_local(model, stages, micro_batch, seq_len, warmup, iterations, seed, threads, clock,
                                    probe=probe)
    payload = {"model": model.model_dump(), "stages": [_stage_to_json(s) for s in stages], "micro_batch": micro_batch,
               "seq_len": seq_len, "warmup": warmup, "iterations": iterations, "seed": seed, "threads": threads,
               "clock": clock, "probe": probe}
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = os.path.join(tmp, "stages.json"), os.path.join(tmp, "timings.json")
        Path(spec).write_text(json.dumps(payload))
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "trainsim.measure.stage", spec, str(rank), str(world),
                                   str(port), out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for rank in range(world)]
        errors = [proc.communicate(timeout=timeout_s)[1] for proc in procs]
        failed = [(rank, err) for rank, (proc, err) in enumerate(zip(procs, errors, strict=True)) if proc.returncode]
        if failed:
            rank, err = failed[0]
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"stage measurement rank {rank} failed: {last[0]}")
        data = json.loads(Path(out).read_text())
    if len(data) != len(stages):
        raise RuntimeError(f"stage measurement stopped after {len(data)} of {len(stages)} stages")
    return [StageTiming(d["latency_s"], d["state_bytes"], d["activation_bytes"], tuple(d["samples_s"]),
                        tuple(d["reference_s"])) for d in data]


if __name__ == "__main__":  # one rank of measure_stages: SPEC RANK WORLD PORT OUT
    _spec, _rank, _world, _port, _out = sys.argv[1:6]
    _worker(int(_rank), int(_world), int(_port), json.loads(Path(_spec).read_text()), _out)
