"""A synthetic 1F1B pipeline ExecGraph of any size, for engine tests and speed benchmarks (not a cost model).

Per stage (one simulated device), micro-batch and layer: a forward and a backward compute task, each
followed by a tensor-parallel all-reduce on the feature stream (blocking the next layer); per micro-batch
an activation send and a gradient send between neighbouring stages; per layer a data-parallel gradient
all-reduce on the gradient stream after the last backward, over a NIC shared by pairs of stages; and one
embedding all-reduce that synchronizes the first and the last stage. Durations are jittered by a seeded RNG.
"""

import random

from trainsim.errors import ConfigError
from trainsim.ir.exec_graph import ExecGraph, SimDevice, Task

_ACTIVATION_BYTES = 5e7  # NB: arbitrary sizes; only their bookkeeping is exercised
_STATIC_BYTES = 1e10


def one_f_one_b_order(stages: int, stage: int, micro_batches: int) -> list[tuple[str, int]]:
    """The 1F1B order of one stage: p - s - 1 warm-up forwards, then one forward one backward, then drain."""
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", mb) for mb in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", mb) for mb in range(micro_batches - warmup, micro_batches)]
    return order


def synthetic_pipeline(*, stages: int, micro_batches: int, layers_per_stage: int, seed: int = 0) -> ExecGraph:
    """Tasks: stages x (micro_batches x (4 layers + 2) + layers) + 2, less the sends out of the end stages."""
    for field, value in (("stages", stages), ("micro_batches", micro_batches), ("layers_per_stage", layers_per_stage)):
        if value < 1:
            raise ConfigError(field, value, "must be >= 1")
    rng = random.Random(seed)
    devices = [SimDevice(index=s, stage=s, ranks=8, capacity_bytes=8e10, static_bytes=_STATIC_BYTES,
                         static_breakdown={"weights": _STATIC_BYTES}) for s in range(stages)]
    graph = ExecGraph(devices=devices, tasks=[])

    def add(name: str, stage: int, stream: str, kind: str, duration_s: float, **fields: object) -> Task:
        jittered = duration_s * rng.uniform(0.8, 1.2)
        return graph.add(name=name, device=stage, stream=stream, kind=kind, duration_s=jittered, stage=stage, **fields)

    first: dict[tuple[str, int, int], Task] = {}  # first task of a (F|B, stage, micro-batch) block
    last: dict[tuple[str, int, int], Task] = {}
    sends: dict[tuple[str, int, int], Task] = {}
    last_backward: dict[tuple[int, int], Task] = {}
    for s in range(stages):
        previous: Task | None = None
        for op, mb in one_f_one_b_order(stages, s, micro_batches):
            fwd = op == "F"
            for i in range(layers_per_stage):
                layer = i if fwd else layers_per_stage - 1 - i
                comp = add(f"{op}{mb}.L{layer}", s, "compute", "compute", 1e-3 if fwd else 2e-3,
                           deps=(previous.tid,) if previous else (), phase="fwd" if fwd else "bwd", layer=f"L{layer}",
                           micro_batch=mb, category="compute",
                           alloc_bytes=_ACTIVATION_BYTES if fwd else 0.0, free_bytes=0.0 if fwd else _ACTIVATION_BYTES)
                first.setdefault((op, s, mb), comp)
                if not fwd and mb == micro_batches - 1:
                    last_backward[(s, layer)] = comp
                previous = add(f"{op}{mb}.L{layer}.tp_ar", s, "feature", "comm", 2e-4, deps=(comp.tid,), phase="comm",
                               layer=f"L{layer}", micro_batch=mb, category="tp_comm", resources=(f"node{s}.nvlink",))
            assert previous is not None  # layers_per_stage >= 1
            last[(op, s, mb)] = previous
            if (fwd and s + 1 < stages) or (not fwd and s > 0):
                sends[(op, s, mb)] = add(f"send_{'act' if fwd else 'grad'}{mb}", s, "feature", "comm", 3e-4,
                                         deps=(previous.tid,), phase="comm", micro_batch=mb, category="pp_comm",
                                         resources=(f"node{s // 2}.nic",))
    for (op, s, mb), task in first.items():  # cross-stage edges, now that every task exists
        upstream = sends.get(("F", s - 1, mb)) if op == "F" else sends.get(("B", s + 1, mb))
        if upstream is not None:
            task.deps = (*task.deps, upstream.tid)
    for s in range(stages):
        for layer in range(layers_per_stage):
            bwd = last_backward[(s, layer)]
            add(f"dp_ar.L{layer}", s, "gradient", "comm", 5e-3, deps=(bwd.tid,), phase="comm", layer=f"L{layer}",
                category="dp_comm", resources=(f"node{s // 2}.nic",))
    for s in sorted({0, stages - 1}):
        add("embed_ar", s, "gradient", "comm", 1e-3, deps=(last[("B", s, micro_batches - 1)].tid,), phase="comm",
            sync_key="embedding-grads", category="dp_comm", resources=(f"node{s // 2}.nic",))
    return graph
