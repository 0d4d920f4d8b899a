"""Apply a job's strategy to the PyTorch model with PyTorch's own parallel APIs, and build its training step.

- ranks: a DeviceMesh (pp, dp, tp), tp fastest and pp slowest, as ParallelSpec orders them (Megatron-LM);
- tp (+sp): torch.distributed.tensor.parallel (ColwiseParallel / RowwiseParallel / SequenceParallel) as
  torchtitan applies it; a vocab-parallel output head and loss (loss_parallel), as Megatron's; a strategy tree's
  per-op tp configs (each op split over its own degree, or whole) by measure/op_parallel.py;
- dp: DistributedDataParallel (zero=0), + ZeroRedundancyOptimizer (zero=1), FSDP2 fully_shard per layer and
  per chunk (zero=2 keeps parameters gathered after forward, zero=3 reshards them);
- pp: torch.distributed.pipelining PipelineStage + ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B;
  a tied embedding's gradient is all-reduced between the first and the last stage (Megatron);
- precision: torch.autocast for amp-bf16 over fp32 weights; bf16: a 16-bit model whose optimizer steps fp32 main
  copies (MainParams, one rank); recompute: torch.utils.checkpoint (model.py);
- gradient accumulation over the micro-batches of a step without pp (DDP no_sync, FSDP2 gradient sync off).
"""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.measure.model import Block, MoE, TransformerChunk, build_chunk, lm_loss, split_layers
from trainsim.measure.tp_degrees import TpDegrees, TpDims
from trainsim.strategy.stages import virtual_stage_blocks

if TYPE_CHECKING:  # torch.distributed.tensor takes seconds to import: only plans with tp load it
    from trainsim.measure.op_splits import TokenSplit

LEARNING_RATE = 1e-4
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb=25


@dataclass(frozen=True, slots=True)
class Topology:
    """This rank's place in the (pp, dp, tp) mesh."""

    mesh: DeviceMesh
    rank: int
    pp_rank: int
    dp_rank: int
    tp_rank: int

    def group(self, axis: str) -> dist.ProcessGroup:
        return self.mesh[axis].get_group()


def make_topology(job: Job, device_type: str) -> Topology:
    p = job.parallel
    mesh = init_device_mesh(device_type, (p.pp, p.dp, p.tp), mesh_dim_names=("pp", "dp", "tp"))
    rank = dist.get_rank()
    return Topology(mesh, rank, mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank(),
                    mesh["tp"].get_local_rank())


# --- tensor and sequence parallelism ---


def apply_tp(chunk: TransformerChunk, spec: TransformerSpec, topo: Topology, sp: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp_mesh = topo.mesh["tp"]
    tp = tp_mesh.size()
    residual = Shard(1) if sp else Replicate()
    if chunk.embed is not None:
        # Megatron: a vocab-parallel embedding all-reduces; with sp and no position table it reduce-scatters
        direct = sp and chunk.embed.pos is None
        parallelize_module(chunk.embed, tp_mesh, {"tok": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1) if direct else Replicate())})
        if sp and not direct:  # positions added to the whole sequence, then each rank keeps its slice
            parallelize_module(chunk, tp_mesh, {"embed": PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1))})
    for block in chunk.layers.values():
        plan: dict[str, Any] = {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=residual),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=residual),
        }
        if getattr(block.mlp, "gate", None) is not None:
            plan["mlp.gate"] = ColwiseParallel()
        if sp:
            for norm, sub in (("attn_norm", "attn"), ("mlp_norm", "mlp")):
                plan[norm] = SequenceParallel()
                plan[sub] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        else:  # one f for q, k and v (and gate and up): measure/op_parallel.py fused_input
            for sub in ("attn", "mlp") if "mlp.gate" in plan else ("attn",):
                plan[sub] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
        parallelize_module(block, tp_mesh, plan)
        assert isinstance(block, Block)
        block.attn.head_offset = topo.tp_rank * spec.num_heads // tp
    head = chunk.head
    if head is not None:
        if sp:
            parallelize_module(head, tp_mesh, {"norm": SequenceParallel()})
        if head.weight is not None:
            sharded = distribute_tensor(head.weight.data, tp_mesh, [Shard(0)])
            head.register_parameter("weight", nn.Parameter(sharded))


# --- data parallelism ---


def apply_fsdp(chunk: TransformerChunk, topo: Topology, zero: int) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    dp_mesh = topo.mesh["dp"]
    reshard = zero == 3
    for block in chunk.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=reshard)
    return chunk


def wrap_data_parallel(chunk: TransformerChunk, job: Job, topo: Topology) -> nn.Module:
    p = job.parallel
    if p.dp == 1:
        return chunk
    if p.zero >= 2:
        return apply_fsdp(chunk, topo, p.zero)
    if p.pp > 1:  # gradients all-reduced after the pipeline flush: see all_reduce_grads
        return chunk
    from torch.nn.parallel import DistributedDataParallel

    # top-k routing can leave an expert with no token on a rank (one sequence of 64 tokens per rank, 4 experts,
    # top 1: the MoE job's even dp-4 split failed so); DDP then waits for a gradient that never comes unless told
    # to look for unused parameters (torch.nn.parallel.DistributedDataParallel, find_unused_parameters)
    routed = any(isinstance(module, MoE) for module in chunk.modules())
    return DistributedDataParallel(chunk, process_group=topo.group("dp"), find_unused_parameters=routed)


def all_reduce_grads(params: list[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Average gradients over the data-parallel group in DDP-sized buckets, after the backward of every
    micro-batch. NB: with pp this replaces DDP, whose reducer cannot follow a pipeline schedule (forwards of
    several micro-batches before their backwards break its bucket bookkeeping and its results); it is
    Megatron-LM's default (no --overlap-grad-reduce): the reduction starts when the pipeline has flushed."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad for p in params if p.grad is not None]
    bucket: list[torch.Tensor] = []
    used = 0
    for i, grad in enumerate(grads):
        bucket.append(grad)
        used += grad.numel() * grad.element_size()
        if used >= DDP_BUCKET_BYTES or i == len(grads) - 1:
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=group)
            flat.div_(size)
            for g, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                g.copy_(reduced)
            bucket, used = [], 0


def make_optimizer(params: list[nn.Parameter], job: Job, topo: Topology) -> torch.optim.Optimizer:
    """AdamW run the way the job's optimizer_impl says (fused, foreach or one tensor at a time)."""
    impl = job.parallel.optimizer_impl
    options = {"lr": LEARNING_RATE, "fused": impl == "fused", "foreach": impl == "foreach"}
    if job.parallel.zero == 1 and job.parallel.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,  # type: ignore[return-value]
                                       process_group=topo.group("dp"), **options)
    return torch.optim.AdamW(params, **options)


# --- the training step ---


@dataclass
class Batch:
    """One step's synthetic tokens on this rank: micro-batches x [micro_batch, seq_len]. The global batch is
    drawn from one seed and each data-parallel rank takes its rows, so every strategy of a job trains on the
    same data (and reaches the same loss)."""

    tokens: list[torch.Tensor]
    labels: list[torch.Tensor]


def make_batch(job: Job, topo: Topology, device: torch.device, seed: int) -> Batch:
    p = job.parallel
    assert isinstance(job.model, TransformerSpec)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, job.model.vocab, (p.global_batch, p.seq_len), generator=gen)
    labels = torch.randint(0, job.model.vocab, (p.global_batch, p.seq_len), generator=gen)
    rows = p.global_batch // p.dp
    mine = slice(topo.dp_rank * rows, (topo.dp_rank + 1) * rows)
    return Batch([t.to(device) for t in tokens[mine].split(p.micro_batch)],
                 [t.to(device) for t in labels[mine].split(p.micro_batch)])


class Trainer:
    """One training iteration of this rank: forward and backward over every micro-batch, the gradient
    reductions of the strategy, and the optimizer step. step() returns this rank's loss (nan where the rank
    computes none: the pipeline's non-last stages)."""

    def __init__(self, job: Job, topo: Topology, device: torch.device, seed: int = 0,
                 tp_degrees: TpDegrees | None = None, tp_dims: TpDims | None = None) -> None:
        self.job = job
        self.tp_degrees = tp_degrees  # a strategy tree's per-op tp degrees (measure/op_parallel.py); None: Megatron's
        self.tp_dims = tp_dims  # and the splits of those ops that are not Megatron's (measure/op_splits.py)
        self.token_splits: list[TokenSplit] = []  # weights whose gradients are summed over their token-split ranks
        self.topo = topo
        self.device = device
        self.seed = seed
        self.autocast: Callable[[], AbstractContextManager[Any]] = _autocast(job, device)
        self.loss_context: Callable[[], AbstractContextManager[Any]] = _loss_context(job)
        self.batch = make_batch(job, topo, device, seed)
        self.chunks = self._build_chunks()
        self.modules = [wrap_data_parallel(chunk, job, topo) for chunk in self.chunks]
        params = [p for m in self.modules for p in m.parameters()]
        self.main_params = MainParams(params) if job.parallel.precision == "bf16" else None
        self.optimizer = make_optimizer(self.main_params.main if self.main_params else params, job, topo)
        self.loss_fn = fp32_loss if self.main_params else lm_loss
        self.embedding_group = self._embedding_group()
        self.schedule = self._schedule() if job.parallel.pp > 1 else None
        p = job.parallel
        self.manual_grad_sync = p.pp > 1 and p.dp > 1 and p.zero < 2
        self.params = params

    @property
    def computes_loss(self) -> bool:
        """The ranks whose step() loss counts: the last pipeline stage, tensor-parallel rank 0."""
        p = self.job.parallel
        return self.topo.tp_rank == 0 and p.pp * p.vpp - 1 in self.stage_indices

    @property
    def stage_indices(self) -> list[int]:
        p = self.job.parallel
        return [self.topo.pp_rank + k * p.pp for k in range(p.vpp)]

    def _build_chunks(self) -> list[TransformerChunk]:
        spec = self.job.model
        assert isinstance(spec, TransformerSpec)
        p = self.job.parallel
        plans = split_layers(spec.num_layers, p.pp * p.vpp, virtual_stage_blocks(spec.num_layers, p))
        chunks = []
        with torch.device(self.device):
            for index in self.stage_indices:
                chunk = build_chunk(spec, plans[index], p.recompute, self.seed, experts=spec.is_moe,
                                    attention=p.attention)
                if p.tp > 1 and self.tp_degrees is not None:
                    from trainsim.measure.op_parallel import apply_op_tp

                    self.token_splits += apply_op_tp(chunk, spec, self.topo.mesh["tp"], self.tp_degrees,
                                                     self.tp_dims)
                elif p.tp > 1:
                    apply_tp(chunk, spec, self.topo, p.sp)
                if p.precision == "bf16":
                    chunk.to(torch.bfloat16)
                chunks.append(chunk)
        return chunks

    def _embedding_group(self) -> dist.ProcessGroup | None:
        """The (first stage, last stage) pairs that share a tied embedding; every rank creates every group."""
        p = self.job.parallel
        spec = self.job.model
        if p.pp == 1 or not (isinstance(spec, TransformerSpec) and spec.tied_embeddings):
            return None
        ranks = self.topo.mesh.mesh  # [pp, dp, tp] -> global rank
        mine = None
        for d in range(p.dp):
            for t in range(p.tp):
                pair = [int(ranks[0, d, t]), int(ranks[p.pp - 1, d, t])]
                group = dist.new_group(pair)  # every rank calls it; members get the group
                if self.topo.rank in pair:
                    assert isinstance(group, dist.ProcessGroup)
                    mine = group
        return mine

    def _schedule(self) -> Any:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        p = self.job.parallel
        stages = [PipelineStage(module, index, p.pp * p.vpp, self.device, group=self.topo.group("pp"))
                  for module, index in zip(self.modules, self.stage_indices, strict=True)]
        n = p.num_micro_batches
        if p.schedule == "interleaved-1f1b":
            return ScheduleInterleaved1F1B(stages, n_microbatches=n, loss_fn=lm_loss)  # type: ignore[arg-type]
        cls = ScheduleGPipe if p.schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], n_microbatches=n, loss_fn=lm_loss)

    def step(self) -> float:
        loss = self.gradients()
        if self.main_params:
            self.main_params.grads_to_main()
        self.optimizer.step()
        if self.main_params:
            self.main_params.main_to_model()
        return loss

    def gradients(self) -> float:
        """The step up to the optimizer: forward and backward over every micro-batch and the gradient reductions
        (the weights held whole by token-split ranks, dp, the tied embedding's stages); returns the loss. Each
        parameter's .grad is then its gradient of the step's loss (the numerics tests compare them)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._pipeline_step() if self.schedule is not None else self._local_step()
        if self.token_splits:  # a strategy tree's tp splits by tokens only
            from trainsim.measure.op_collectives import sum_grads

            for params, group in self.token_splits:
                sum_grads(params, group)
        if self.manual_grad_sync:
            all_reduce_grads(self.params, self.topo.group("dp"), self.job.parallel.dp)
        self._sync_tied_embedding()
        return loss

    def _local_step(self) -> float:
        (module,) = self.modules
        n = len(self.batch.tokens)
        losses: list[torch.Tensor] = []
        for i, (tokens, labels) in enumerate(zip(self.batch.tokens, self.batch.labels, strict=True)):
            with _grad_sync(module, last=i == n - 1), self.loss_context():
                with self.autocast():
                    loss = self.loss_fn(module(tokens), labels) / n
                loss.backward()
            losses.append(_local(loss.detach()))
        return float(torch.stack(losses).sum())  # one device sync per step, after the backward passes

    def _pipeline_step(self) -> float:
        last_stage = self.job.parallel.pp * self.job.parallel.vpp - 1
        kwargs: dict[str, Any] = {}
        args: tuple[torch.Tensor, ...] = ()
        losses: list[torch.Tensor] = []
        if 0 in self.stage_indices:
            args = (torch.cat(self.batch.tokens),)
        if last_stage in self.stage_indices:
            kwargs = {"target": torch.cat(self.batch.labels), "losses": losses}
        assert self.schedule is not None
        with self.loss_context(), self.autocast():
            self.schedule.step(*args, **kwargs)
        if not losses:
            return float("nan")
        return float(sum(float(_local(x.detach())) for x in losses) / len(losses))

    def _sync_tied_embedding(self) -> None:
        if self.embedding_group is None:
            return
        from torch.distributed.tensor import DTensor

        for chunk in self.chunks:
            weight = chunk.tied_weight()
            if weight is None or weight.grad is None:
                continue
            grad = weight.grad
            if isinstance(grad, DTensor) and isinstance(weight, DTensor) and grad.placements != weight.placements:
                # NB: the vocab-parallel embedding's gradient can come back replicated; shard it as its weight
                # is (a local slice, no communication) so both stages all-reduce the same rows
                grad = grad.redistribute(placements=weight.placements)
                weight.grad = grad
            dist.all_reduce(_local(grad), group=self.embedding_group)


class MainParams:
    """fp32 main copies of a 16-bit model's parameters, as Megatron-LM's mixed-precision optimizer keeps them
    (megatron/core/optimizer/optimizer.py, Float16OptimizerWithFloat16Params, megatron-core 0.9.0): the
    optimizer steps the fp32 copies; before the step each 16-bit gradient becomes its main parameter's fp32
    gradient (_copy_model_grads_to_main_grads), after it the main parameters are copied back into the model in
    one multi-tensor copy (_copy_main_params_to_model_params)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.model = params
        self.main = [nn.Parameter(p.detach().float()) for p in params]

    def grads_to_main(self) -> None:
        """Each 16-bit gradient is freed as its fp32 copy is made: at most one tensor's worth over Megatron's
        18 bytes a parameter (its fp32 main_grad buffer takes the gradients directly)."""
        for main, param in zip(self.main, self.model, strict=True):
            main.grad = None if param.grad is None else param.grad.float()
            param.grad = None

    @torch.no_grad()
    def main_to_model(self) -> None:
        copy = torch._foreach_copy_  # pyright: ignore[reportPrivateImportUsage]  # NB: multi-tensor copy, as Megatron's
        copy([p.data for p in self.model], [p.data for p in self.main])


def fp32_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of a 16-bit model on fp32 logits (Megatron-LM's default: no --fp16-lm-cross-entropy)."""
    return lm_loss(logits.float(), labels)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _autocast(job: Job, device: torch.device) -> Callable[[], AbstractContextManager[Any]]:
    if job.parallel.precision == "amp-bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    if job.parallel.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return nullcontext


def _loss_context(job: Job) -> Callable[[], AbstractContextManager[Any]]:
    if job.parallel.tp == 1:
        return nullcontext
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel


def _grad_sync(module: nn.Module, last: bool) -> AbstractContextManager[Any]:
    """Reduce gradients only after the last micro-batch of a step (gradient accumulation)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        return nullcontext() if last else module.no_sync()
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(last)
    return nullcontext()

