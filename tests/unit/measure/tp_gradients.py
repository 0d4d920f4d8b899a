"""A gradient comparison for per-op tp configs (measure/op_parallel.py): `world` gloo ranks each build the job's tp
Trainer for a strategy tree, run one step up to the optimizer (Trainer.gradients: forward, backward and the
gradient reductions), and compare the loss and every parameter's whole gradient (a DTensor's gathered; a weight
held whole, as it is) with the unsplit model's on the same batch. A gradient counted twice, or summed where it
should not be, fails here, where a loss after AdamW steps barely moves (Adam's update is invariant to a gradient's
scale). The ranks are spawned once per world size and run every case of that size in turn, each case's failure
reported under its name. Rank 0 also records the collectives of that step (measure.collective_log), which a test
compares with the priced ones. Imported by the tests (and by the ranks they spawn)."""

import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from conftest import TINY_GPT_MODEL_YAML

TINY_LLAMA_MODEL_YAML = TINY_GPT_MODEL_YAML.replace("name: tiny-gpt", "name: tiny-llama").replace(
    "mlp: gelu", "mlp: swiglu").replace("norm: layernorm", "norm: rmsnorm").replace(
    "position: learned", "position: rope").replace("bias: true", "bias: false").replace(
    "tied_embeddings: true", "tied_embeddings: false") + "num_kv_heads: 2\n"
RTOL = 1e-4  # fp32: the split run sums in another order (reduce-scatters, statistics all-reduced)
ATOL = 1e-6  # of the largest gradient: a gradient that is zero in exact arithmetic (a key's bias) is rounding


def tree_yaml(tp: int, *splits: str) -> str:
    """A strategy tree over tp from "path dim parts" rows (the rest Megatron's)."""
    rows = "".join(f"    - {{path: \"{path}\", item: compute, dim: {dim}, parts: {parts}, axis: tp}}\n"
                   for path, dim, parts in (s.split() for s in splits))
    return f"strategy_tree:\n  map:\n    - {{tp: {tp}}}\n  split:\n{rows}"


@dataclass(frozen=True, kw_only=True)
class Case:
    """One gradient comparison: a model and a tree over `tp` ranks, with the job's other settings."""

    model_yaml: str
    tree_yaml: str
    tp: int = 2
    settings: dict[str, Any] = field(default_factory=dict)
    sum_token_splits_twice: bool = False  # a mutation: the token-split weights' gradients summed a second time


def step_collectives(tmp_path: Path, cases: dict[str, Case], name: str) -> list[tuple[str, int]]:
    """Rank 0's collectives of the compared step of case `name` (after compare_gradients on the same tmp_path):
    (collective, bytes) rows in the order issued."""
    case = cases[name]
    index = [n for n, c in cases.items() if c.tp == case.tp].index(name)
    rows = json.loads((tmp_path / f"tp{case.tp}-case{index}" / "collectives.json").read_text())
    return [(collective, size) for collective, size in rows]


def compare_gradients(cases: dict[str, Case], tmp_path: Path) -> dict[str, str]:
    """Each case's failure ("" where it passed), named as in `cases`. The ranks are spawned once per world size
    and run every case of that size in turn (start-up, importing torch, dominates a case)."""
    from torch.multiprocessing.spawn import spawn

    failures = {}
    for tp in sorted({case.tp for case in cases.values()}):
        names = [name for name, case in cases.items() if case.tp == tp]
        jobs = [_write_case(cases[name], tmp_path / f"tp{tp}-case{i}") for i, name in enumerate(names)]
        spawn(_rank, args=(tp, str(tmp_path / f"tp{tp}-store"), jobs), nprocs=tp, join=True)
        for name, (_, tree) in zip(names, jobs, strict=True):
            messages = (Path(tree).with_name(f"rank{rank}.txt").read_text() for rank in range(tp))
            failures[name] = "\n".join(f"rank {rank}: {m}" for rank, m in enumerate(messages) if m)
    return failures


def _write_case(case: Case, folder: Path) -> tuple[dict[str, Any], str]:
    folder.mkdir(parents=True)
    model, tree = folder / "model.yaml", folder / "tree.yaml"
    model.write_text(case.model_yaml)
    tree.write_text(case.tree_yaml)
    job = {"model": str(model), "tp": case.tp, "num_gpus": case.tp, "micro_batch": 2, "global_batch": 4,
           "seq_len": 16, "precision": "fp32", "cluster": "local-cpu", **case.settings}
    if case.sum_token_splits_twice:
        job["_mutation"] = "sum_token_splits_twice"
    return job, str(tree)


def _rank(rank: int, world: int, store: str, jobs: list[tuple[dict[str, Any], str]]) -> None:
    """Run every case on one process group; each case's message (or "") goes to rank<r>.txt beside its tree."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # a case that fails on one rank inside a collective times the others out instead of hanging them
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        for settings, tree in jobs:
            try:
                _check(settings, Path(tree))
                message = ""
            except Exception as error:  # reported as the case's failure; the next case runs
                message = f"{type(error).__name__}: {error}"
            Path(tree).with_name(f"rank{rank}.txt").write_text(message)
    finally:
        dist.destroy_process_group()


def _check(settings: dict[str, Any], tree: Path) -> None:
    import torch

    from trainsim.frontends.catalog.build import build_graph
    from trainsim.jobfile import job_from_settings
    from trainsim.measure.collective_log import CollectiveLog
    from trainsim.measure.model import build_model, lm_loss
    from trainsim.measure.op_collectives import sum_grads
    from trainsim.measure.parallelize import Trainer, make_topology
    from trainsim.measure.tp_degrees import plan_tp_layout
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree_yaml import load_tree_yaml

    settings = dict(settings)
    mutation = settings.pop("_mutation", "")
    job = job_from_settings(settings)
    plan = load_tree_yaml(tree, build_graph(job.model, DeviceSlice.of(job.parallel))).lower(job.parallel)
    degrees, dims = plan_tp_layout(plan, job.parallel)
    trainer = Trainer(job, make_topology(job, "cpu"), torch.device("cpu"), 0, tp_degrees=degrees, tp_dims=dims)
    with CollectiveLog() as log:
        loss = trainer.gradients()
    if trainer.topo.rank == 0:
        tree.with_name("collectives.json").write_text(json.dumps(log.rows))
    if mutation == "sum_token_splits_twice":
        for params, group in trainer.token_splits:
            sum_grads(params, group)
    whole = build_model(job.model, seed=0, attention=job.parallel.attention,  # type: ignore[arg-type]
                        experts=job.model.is_moe)  # type: ignore[union-attr]
    n = len(trainer.batch.tokens)
    reference = 0.0
    for tokens, labels in zip(trainer.batch.tokens, trainer.batch.labels, strict=True):
        part = lm_loss(whole(tokens), labels) / n
        part.backward()
        reference += float(part.detach())
    wrong = []  # raised after the last collective: a rank raising sooner would leave the others waiting
    if trainer.computes_loss and abs(loss - reference) > 1e-5 * abs(reference):
        wrong.append(f"loss {loss!r}, unsplit {reference!r}")
    expected = dict(whole.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in expected.values() if p.grad is not None)
    (chunk,) = trainer.chunks
    for name, param in chunk.named_parameters():  # the same order on every rank: full_tensor is a collective
        got = _whole_gradient(param.grad)
        want = expected[name].grad
        if got is None and want is None:  # an expert no token was routed to, in both
            continue
        assert want is not None and got is not None, f"{name}: gradient {got is not None}, unsplit's {want is not None}"
        if not torch.allclose(got, want, rtol=RTOL, atol=ATOL * scale):
            wrong.append(f"{name}: max |diff| {float((got - want).abs().max()):.3g}, max |want| "
                         f"{float(want.abs().max()):.3g}")
    assert not wrong, "; ".join(wrong)


def _whole_gradient(grad: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if not isinstance(grad, DTensor):
        return grad
    assert not any(p.is_partial() for p in grad.placements), grad.placements  # a sum left undone
    return grad.full_tensor()
