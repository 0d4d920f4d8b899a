"""How a group of devices holds a tensor (Placement) and how an op's computation config splits its dimensions
(OpConfig): Proteus Sec. II-A, IV-B. The compiler prices the collectives between placements (strategy.reshard,
compile.splits); the measured run executes them (measure.split_model).
"""

from dataclasses import dataclass

from trainsim.errors import ConfigError

CONTRACTING = ("matmul", "conv")  # ops with a reduction dimension a config may split
DIMS = ("batch", "seq", "feature")


@dataclass(frozen=True, slots=True)
class Placement:
    group: int  # devices holding the tensor
    batch: int = 1
    seq: int = 1
    feature: int = 1
    partial: int = 1

    def __post_init__(self) -> None:
        for name in ("group", *DIMS, "partial"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"placement.{name}", value, "must be an integer >= 1")
        if self.group % self.shards != 0:
            raise ConfigError("placement", self.describe(), f"its parts must divide the group of {self.group}")

    @property
    def shards(self) -> int:
        return self.batch * self.seq * self.feature * self.partial

    @property
    def replicas(self) -> int:
        return self.group // self.shards

    def degree(self, dim: str) -> int:
        return int(getattr(self, dim))

    def describe(self) -> str:
        parts = [f"{dim}/{self.degree(dim)}" for dim in DIMS if self.degree(dim) > 1]
        if self.partial > 1:
            parts.append(f"partial{self.partial}")
        return f"[{' '.join(parts) or 'replicated'} of {self.group}]"



@dataclass(frozen=True, slots=True)
class OpConfig:
    batch: int
    seq: int
    out: int
    reduce: int

    @property
    def parts(self) -> int:
        return self.batch * self.seq * self.out * self.reduce


def input_placement(config: OpConfig, group: int, contracting: bool) -> Placement:
    """How an op under `config` reads its input: batch and sequence as split, features as its reduction
    dimension (a matmul or conv) or its output dimension (any other op) is split."""
    return Placement(group, config.batch, config.seq, config.reduce if contracting else config.out)


def output_placement(config: OpConfig, group: int, contracting: bool) -> Placement:
    """How an op under `config` leaves its output: a split reduction dimension leaves partial sums."""
    if contracting:
        return Placement(group, config.batch, config.seq, config.out, config.reduce)
    return Placement(group, config.batch, config.seq, config.out)


def input_grad_placement(need: Placement, config: OpConfig, contracting: bool) -> Placement:
    """The gradient of an op's input as its backward makes it: placed as the input was read, partial over the
    devices that split the op's output dimension (each holds one slice of dY W)."""
    partial = config.out if contracting else 1
    return Placement(need.group, need.batch, need.seq, need.feature, partial)


def output_grad_placement(produced: Placement) -> Placement:
    """The gradient of an op's output as its backward reads it: placed as the output, whole sums (a producer of
    partial sums reads the gradient replicated over them)."""
    return Placement(produced.group, produced.batch, produced.seq, produced.feature)
