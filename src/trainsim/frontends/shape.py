"""The per-device slice of a job that a builder needs: batch, sequence, dtypes and the split degrees."""

from dataclasses import dataclass

from trainsim.strategy.precision import PrecisionPolicy


@dataclass(frozen=True, slots=True)
class DeviceSlice:
    micro_batch: int
    seq_len: int
    precision: PrecisionPolicy
    tp: int = 1
    sp: bool = False
    cp: int = 1
    ep: int = 1
    fused_attention: bool = True

    @property
    def local_tokens(self) -> int:
        """Tokens of one micro-batch on one device after the context split."""
        return self.micro_batch * self.seq_len // self.cp
