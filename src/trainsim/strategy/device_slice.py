"""The per-device slice of a job that a builder needs: batch, sequence, dtypes and the split degrees."""

from dataclasses import dataclass

from trainsim.strategy.parallel import AttentionKernel, ParallelSpec
from trainsim.strategy.precision import PrecisionPolicy, policy_for


@dataclass(frozen=True, slots=True)
class DeviceSlice:
    micro_batch: int
    seq_len: int
    precision: PrecisionPolicy
    tp: int = 1
    sp: bool = False
    cp: int = 1
    ep: int = 1
    attention: AttentionKernel = "flash2"

    @classmethod
    def of(cls, par: ParallelSpec) -> "DeviceSlice":
        """The slice one device of a job with this strategy computes."""
        return cls(par.micro_batch, par.seq_len, policy_for(par.precision), par.tp, par.sp, par.cp, par.ep,
                   par.attention)

    @property
    def fused_attention(self) -> bool:
        return self.attention != "math"

    @property
    def local_tokens(self) -> int:
        """Tokens of one micro-batch on one device after the context split."""
        return self.micro_batch * self.seq_len // self.cp
