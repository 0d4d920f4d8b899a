"""The per-device slice of a job: the settings that decide the op shapes and dtypes on one device (what a graph
builder needs, and what a profile of a job measures)."""

from dataclasses import dataclass, field

from trainsim.strategy.parallel import AttentionKernel, ParallelSpec
from trainsim.strategy.precision import PrecisionPolicy, policy_for
from trainsim.strategy.stack import MoeDispatcher, StackSpec


@dataclass(frozen=True, slots=True)
class DeviceSlice:
    """Equality and hash cover what decides op shapes and dtypes, so a graph cache keyed by a slice holds one
    OpGraph for every ZeRO stage; `zero` rides along for the profiler (which frameworks' overhead a job pays)."""

    micro_batch: int
    seq_len: int
    precision: PrecisionPolicy
    tp: int = 1
    sp: bool = False
    cp: int = 1
    ep: int = 1
    attention: AttentionKernel = "flash2"
    zero: int = field(default=0, compare=False)  # ZeRO-2/3 (FSDP2) adds a per-layer framework overhead
    moe_dispatcher: MoeDispatcher = "alltoall"  # the stack's (StackSpec.moe_dispatcher): an MoE block's collectives

    @classmethod
    def of(cls, par: ParallelSpec, stack: StackSpec | None = None) -> "DeviceSlice":
        """The slice one device of a job with this strategy (and training stack: default generic) computes."""
        return cls(par.micro_batch, par.seq_len, policy_for(par.precision), par.tp, par.sp, par.cp, par.ep,
                   par.attention, par.zero, stack.moe_dispatcher if stack is not None else "alltoall")

    @property
    def fused_attention(self) -> bool:
        return self.attention != "math"

    @property
    def local_tokens(self) -> int:
        """Tokens of one micro-batch on one device after the context split."""
        return self.micro_batch * self.seq_len // self.cp
