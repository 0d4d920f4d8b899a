"""A gradient comparison for the torch front-end's model split by tp styles (measure/front_end_model.py): 2 gloo
ranks build the split model and the unsplit one from the same seed, run one step up to the optimizer on the same
batch with the same dropout masks, and compare the loss and every parameter's whole gradient (a DTensor's gathered,
GPT-2's regrouped q, k, v undone and Conv1D's [in, out] layout restored); rank 0 also records the split step's
collectives (measure.collective_log). Imported by the tests (and by the ranks they spawn)."""

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

RTOL, ATOL = 1e-4, 1e-6  # as tp_gradients: fp32 sums in another order; ATOL of the largest gradient


def compare(settings: dict[str, Any], styles: dict[str, str], folder: Path) -> tuple[list[str], list[list[Any]]]:
    """Each rank's failures (empty where it passed) and rank 0's collectives of the split step."""
    from torch.multiprocessing.spawn import spawn

    folder.mkdir(parents=True, exist_ok=True)
    spawn(_rank, args=(settings, styles, str(folder)), nprocs=settings["tp"], join=True)
    failures = [(folder / f"rank{r}.txt").read_text() for r in range(settings["tp"])]
    collectives = folder / "collectives.json"
    return failures, json.loads(collectives.read_text()) if collectives.exists() else []


def _rank(rank: int, settings: dict[str, Any], styles: dict[str, str], folder: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=settings["tp"],
                            timeout=timedelta(seconds=300))
    try:
        message = ""
        try:
            _check(rank, settings, styles, Path(folder))
        except Exception as error:  # reported as the failure
            message = f"{type(error).__name__}: {error}"
        (Path(folder) / f"rank{rank}.txt").write_text(message)
    finally:
        dist.destroy_process_group()


def _check(rank: int, settings: dict[str, Any], styles: dict[str, str], folder: Path) -> None:
    import torch

    from trainsim.jobfile import job_from_settings
    from trainsim.measure.collective_log import CollectiveLog
    from trainsim.measure.front_end_model import FrontEndTrainer
    from trainsim.measure.parallelize import make_topology

    job = job_from_settings(settings)
    split = FrontEndTrainer(job, make_topology(job, "cpu"), torch.device("cpu"), 0, styles)
    whole = FrontEndTrainer(job, cast(Any, _OneRank()), torch.device("cpu"), 0, {})
    torch.manual_seed(1)  # the same dropout masks on both
    with CollectiveLog() as log:
        loss = split.gradients()
    torch.manual_seed(1)
    reference = whole.gradients()
    if rank == 0:
        (folder / "collectives.json").write_text(json.dumps(log.rows))
    wrong = [] if abs(loss - reference) <= 1e-5 * abs(reference) else [f"loss {loss!r}, unsplit {reference!r}"]
    expected = dict(whole.model.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in expected.values() if p.grad is not None)
    tp = settings["tp"]
    for name, param in split.model.named_parameters():  # the same order on every rank: full_tensor is a collective
        got = _unsplit(name, _whole_gradient(param.grad), whole.model, styles, tp)
        want = expected[name].grad
        assert want is not None and got is not None, name
        if not torch.allclose(got, want, rtol=RTOL, atol=ATOL * scale):
            wrong.append(f"{name}: max |diff| {float((got - want).abs().max()):.3g}")
    assert not wrong, "; ".join(wrong)


class _OneRank:
    """The unsplit model's place: one rank, no mesh (make_batch reads dp_rank; FrontEndTrainer tp_rank)."""

    dp_rank = tp_rank = 0
    mesh = None


def _whole_gradient(grad: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def _unsplit(name: str, grad: Any, whole: Any, styles: dict[str, str], tp: int) -> Any:
    """A split module's gradient in the unsplit module's layout (front_end_model: GPT-2's c_attn regrouped, a
    Conv1D turned into an nn.Linear)."""
    import torch

    module = name.rsplit(".", 1)[0]
    if module not in styles:
        return grad
    if module.endswith(".c_attn"):  # output features back to [q | k | v]
        order = torch.arange(grad.shape[0]).view(3, tp, -1).transpose(0, 1).reshape(-1)
        back = torch.empty_like(grad)
        back[order] = grad
        grad = back
    conv1d = type(whole.get_submodule(module)).__name__ == "Conv1D"
    return grad.t() if conv1d and name.endswith(".weight") else grad
