"""OpGraph: a model as a chain of layers, each a list of forward and backward ops with costs in SI units.

Identical layers (the repeated transformer blocks) are stored once with a repeat count, so an 80-layer model is
as cheap to build and cost as a one-layer model. Shapes are per device: the builder has applied the tensor,
sequence and context split already.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from trainsim.hardware.device import DType

if TYPE_CHECKING:  # NB: type only (start-up: the simulator's graph loads with the engines that use it)
    from trainsim.ir.exec_graph import ExecGraph

OpKind = Literal["matmul", "attention", "elementwise", "norm", "softmax", "embedding", "conv", "pool", "loss"]
Phase = Literal["fwd", "bwd"]
COPY_OP = "copy"  # an elementwise op that copies a tensor's bytes (a reshard's host copies: compile/splits.py)
LayerKind = Literal["embedding", "block", "moe_block", "head", "conv_block", "mlp", "interaction", "sparse"]


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel. shape is (batch, m, n, k) for matmul and attention (m query tokens, n key tokens, k head
    dim), the output shape otherwise.

    A capturing front-end's forward op also carries its data dependencies and what it keeps for its backward
    (the catalog's builders leave them at their defaults: their ops are a chain, their layers' activations
    Layer.saved_bytes): inputs, the positions in its layer's forward ops of the ops whose output it reads (-1:
    the tensor the layer reads; parameters and other layers' tensors left out; None: not known); saved_bytes, the
    activation bytes it keeps for its backward pass (each tensor counted once per layer, with the op that reads
    it first), of which saved_aux_bytes are side outputs selective recompute drops (an attention kernel's
    log-sum-exp, a softmax's output)."""

    name: str
    kind: OpKind
    module_path: str
    phase: Phase
    dtype: DType
    flops: float
    bytes_moved: float
    shape: tuple[int, ...]
    recompute_selective: bool = False  # recomputed under selective recompute (the attention core)
    kernel: str = ""  # attention: the kernel family (strategy.parallel.AttentionKernel); "" elsewhere
    inputs: tuple[int, ...] | None = None
    saved_bytes: float = 0.0
    saved_aux_bytes: float = 0.0

    def describe(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return (f"{self.phase} {self.kind:<11} {self.module_path:<28} {self.dtype:<4} [{dims}] "
                f"{self.flops / 1e9:10.3f} GFLOP {self.bytes_moved / 1e6:10.3f} MB")


@dataclass(frozen=True, slots=True)
class Comm:
    """A collective a layer issues on the critical path (feature communication), per micro-batch.

    axis: which parallel group carries it; bytes_per_rank: the buffer each rank contributes (all-reduce),
    or the full gathered buffer size for all-gather / reduce-scatter; ranks: the ranks of a sub-group of the
    axis' group it spans (consecutive ranks: an op split over fewer ranks than the axis has), 0: the whole group;
    column_input: the name of the column-parallel matmul (Megatron's split: output features over the whole tp
    group) whose input this tp collective reshards, '' for any other: in backward its input gradient's all-reduce
    (or reduce-scatter under sp), in forward under sp the all-gather of its input (which Megatron's backward
    repeats for the weight gradient); what a stack overlaps them with is the pricing's (StackSpec.tp_dgrad_overlap).
    reshard: one a strategy tree's own op configs add beyond the collectives Megatron's split of the layer issues
    (strategy.megatron.layer_comms): a reshard the framework runs outside its tensor-parallel layers, whose host
    cost per call the pricing adds (Pricer.reshard_host_s).
    """

    name: str
    collective: Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"]
    axis: Literal["tp", "cp", "ep", "pp"]
    phase: Phase
    buffer_bytes: float
    ranks: int = 0
    column_input: str = ""
    reshard: bool = False


@dataclass(frozen=True, slots=True)
class ExpertShard:
    """The part of an MoE layer's parameters one device holds that are its experts': its ep share of the experts,
    each split over `tp_degree` tensor-parallel ranks (Megatron-Core's expert_tensor_parallel_size). Their
    gradients and optimizer states belong to the expert data-parallel group, not the data-parallel one
    (strategy.expert_groups)."""

    params: float
    tp_degree: int


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    kind: LayerKind
    count: int
    fwd: tuple[Op, ...]
    bwd: tuple[Op, ...]
    comms: tuple[Comm, ...]
    param_count: float  # parameters held by one device (after tensor/expert sharding)
    full_param_count: float  # parameters of the layer before sharding
    saved_bytes: dict[str, float] = field(default_factory=dict)  # recompute mode -> activation bytes kept
    output_bytes: float = 0.0  # activation passed to the next layer (pipeline send size)
    experts: ExpertShard | None = None  # an MoE layer's experts among param_count (None: no experts)
    hands_on: int | None = None  # the position in fwd of the op writing output_bytes' tensor (None: the last op)

    def flops(self, phase: Phase) -> float:
        return sum(op.flops for op in (self.fwd if phase == "fwd" else self.bwd))

    def recomputed_flops(self, recompute: str) -> float:
        """The FLOPs one instance runs again in the backward pass: its whole forward under full recompute, its
        ops marked recompute_selective under selective recompute (Korthikanti et al. 2022), else none."""
        if recompute == "full":
            return self.flops("fwd")
        if recompute == "selective":
            return sum(op.flops for op in self.fwd if op.recompute_selective)
        return 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredTrace:
    """What a run's per-rank execution traces measured, lowered to an ExecGraph (one simulated device per rank,
    measured op durations): the input of trace replay. measured_step_s and start_offset_s are per rank, in
    the ExecGraph's device order."""

    exec_graph: "ExecGraph"
    ranks: tuple[int, ...]
    measured_step_s: tuple[float, ...]
    start_offset_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class OpGraph:
    """measured: set by the execution-trace front-end (what the traced run did), None for a model built from
    shapes alone. frontend: the front-end that built the layers: "catalog" (per-device shapes, Megatron's splits
    applied by the builder) or a capturing front-end ("torch": one device's whole model, split over tp by a
    strategy tree's configs, compile.shape_front_end). leading_dense_blocks: the first blocks in model order are
    the dense ones (DeepSeek's first_k_dense_replace: its `block` layer's repeats lead, its `moe_block` layer's
    follow); 0: dense and MoE blocks interleaved evenly (strategy.lowered.expand_layers)."""

    model_name: str
    layers: tuple[Layer, ...]
    tokens_per_micro_batch: int  # per device, after the context split
    samples_per_micro_batch: int
    measured: MeasuredTrace | None = None
    frontend: str = "catalog"
    leading_dense_blocks: int = 0

    @property
    def num_ops(self) -> int:
        return sum(layer.count * (len(layer.fwd) + len(layer.bwd)) for layer in self.layers)

    def total_flops(self, phase: Phase) -> float:
        return sum(layer.count * layer.flops(phase) for layer in self.layers)

    def param_count(self) -> float:
        return sum(layer.count * layer.full_param_count for layer in self.layers)

    def pretty(self) -> str:
        lines = [f"OpGraph {self.model_name}: {len(self.layers)} distinct layers, {self.num_ops} ops"]
        for layer in self.layers:
            lines.append(f"  {layer.name} x{layer.count} ({layer.kind}, {layer.param_count:.4g} params/device)")
            lines += [f"    {op.describe()}" for op in layer.fwd + layer.bwd]
            lines += [f"    comm {c.phase} {c.collective} over {c.axis}{f' ({c.ranks} ranks)' if c.ranks else ''}: "
                      f"{c.buffer_bytes / 1e6:.3f} MB"
                      for c in layer.comms]
        return "\n".join(lines)
