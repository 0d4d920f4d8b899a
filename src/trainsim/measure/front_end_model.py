"""The torch front-end's model trained for real: the Hugging Face model the front-end captures (hf.training_config:
the same config, SDPA, attention-probability dropout 0, hidden dropout kept), built with seeded weights on every
rank, its modules split over the tp group by the styles measure/front_end_tp.py read off a strategy tree
(torch.distributed.tensor.parallel's ColwiseParallel and RowwiseParallel), the rest whole; the loss is the model's
own (labels passed in, as the front-end traces it). Each rank draws the same dropout masks (the same seed, and the
split layers draw none), as Megatron-LM's RNG tracker keeps them alike outside the model-parallel regions.

A captured LLaMA's q, k, v (and gate, up) GEMM sits under its attention (MLP) module, which the tree splits: its
linear layers but the row one (o_proj, down_proj) are the column layers, reading one f. GPT-2's Conv1D (x W + b, W
stored [in, out]) is turned into the nn.Linear it equals (W transposed) where a style
splits it, which torch's styles require; its fused q, k, v projection (c_attn) has its output features regrouped so
that rank r's contiguous shard holds its heads of q, k and v (the attention then splits q, k and v at
split_size / tp). NB: the captured graph prices Conv1D's addmm on the stored weight; nn.Linear multiplies by the
transposed view (the same FLOPs and bytes). Imported only inside measure workers (torch).
"""

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainsim.job import Job
from trainsim.measure.front_end_tp import COLWISE, Styles, pair_module
from trainsim.measure.op_parallel import fused_input
from trainsim.measure.parallelize import Topology, make_batch, make_optimizer


class FrontEndTrainer:
    """One training iteration of this rank on the front-end's model (parallelize.Trainer's interface: step,
    gradients, computes_loss, stage_indices)."""

    def __init__(self, job: Job, topo: Topology, device: torch.device, seed: int, styles: Styles) -> None:
        from trainsim.frontends.torch.hf import hf_config_from_spec, model_for, training_config

        self.job, self.topo = job, topo
        torch.manual_seed(seed)  # every rank builds the same weights
        with torch.device(device):
            self.model: nn.Module = model_for(training_config(hf_config_from_spec(job.model)))  # type: ignore[arg-type]
        self.model.train()
        if styles:
            apply_styles(self.model, topo.mesh["tp"], styles)
        torch.manual_seed(seed)  # the dropout masks from the seed, whatever the split drew (DTensor's RNG set-up)
        self.batch = make_batch(job, topo, device, seed)
        self.optimizer = make_optimizer(list(self.model.parameters()), job, topo)
        self.stage_indices = [0]

    @property
    def computes_loss(self) -> bool:
        return self.topo.tp_rank == 0

    def gradients(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        n = len(self.batch.tokens)
        losses = []
        for tokens, labels in zip(self.batch.tokens, self.batch.labels, strict=True):
            loss = self.model(input_ids=tokens, labels=labels).loss / n
            loss.backward()
            losses.append(loss.detach())
        return float(torch.stack(losses).sum())

    def step(self) -> float:
        loss = self.gradients()
        self.optimizer.step()
        return loss


def apply_styles(model: nn.Module, mesh: Any, styles: Styles) -> None:
    """Split the model's modules over the tp mesh as `styles` says (module doc)."""
    tp = mesh.size()
    plan: dict[str, Any] = {}
    columns: dict[str, int] = {}
    for path, style in sorted(styles.items()):
        module = pair_module(path, style, styles)
        if module == path:  # a module whose linear layers but the row one are the column GEMM (front_end_tp)
            owner = model.get_submodule(path)
            names = [f"{path}.{name}" for name, child in owner.named_children()
                     if isinstance(child, nn.Linear) and f"{path}.{name}" not in styles]
        else:
            names = [path]
        for name in names:
            _column_or_row(model, name, style, tp)
            plan[name] = ColwiseParallel() if style == COLWISE else RowwiseParallel()
        columns[module] = columns.get(module, 0) + len(names) * (style == COLWISE)
    parallelize_module(model, mesh, plan)
    for parent_path, count in columns.items():
        if count > 1:  # q, k and v, or gate and up, read one input: one f
            fused_input(model.get_submodule(parent_path), mesh)


def _column_or_row(model: nn.Module, path: str, style: str, tp: int) -> None:
    """The module at `path` made an nn.Linear; GPT-2's fused q, k, v regrouped where it is a column layer."""
    parent_path, name = path.rsplit(".", 1)
    parent = model.get_submodule(parent_path)
    linear = _as_linear(parent.get_submodule(name))
    setattr(parent, name, linear)
    split_size = getattr(parent, "split_size", None)
    if style == COLWISE and isinstance(split_size, int) and linear.out_features == 3 * split_size:
        _regroup_qkv(linear, tp)
        setattr(parent, "split_size", split_size // tp)  # noqa: B010  # an int attribute of HF's attention


def _as_linear(module: nn.Module) -> nn.Linear:
    """nn.Linear as is; GPT-2's Conv1D (transformers.pytorch_utils) as the nn.Linear it equals."""
    if isinstance(module, nn.Linear):
        return module
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    if type(module).__name__ != "Conv1D" or not isinstance(weight, torch.Tensor):
        raise TypeError(f"{type(module).__name__} is not a linear layer")  # front_end_tp checks the op kinds first
    linear = nn.Linear(weight.shape[0], weight.shape[1], bias=bias is not None, device=weight.device,
                       dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight.t())
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


@torch.no_grad()
def _regroup_qkv(linear: nn.Linear, tp: int) -> None:
    """Output features [q | k | v] reordered [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], rank r's heads in its shard."""
    order = torch.arange(linear.out_features).view(3, tp, -1).transpose(0, 1).reshape(-1)
    linear.weight.copy_(linear.weight[order])
    if linear.bias is not None:
        linear.bias.copy_(linear.bias[order])
