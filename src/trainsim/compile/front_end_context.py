"""Megatron-LM's context parallelism on a capturing front-end's graph (Proteus Sec. IV-B and V-B: a split of
every op's sequence, the collective its attention needs inserted and priced).

Under cp (`--cp`) every op of a captured layer runs its rank's share of each sequence (config seq = cp over the
cp group, as the catalog's: strategy.megatron.op_config), so a layer reads and hands on the hidden state split by
sequence over cp and no op between two others reshards over it; the attention core runs its query rows against
the keys and values of the whole sequence, all-gathered over the cp group forward and their gradient
reduce-scattered backward: the catalog's pattern for Megatron-Core's ring attention (strategy.megatron.
cp_kv_exchange, named kv.ag and kv.rs), priced by the Pricer as the catalog's (the part ring attention hides
behind the attention kernels: Pricer.cp_exposed_fraction). The keys and values are of the heads the core
runs on its tp rank (its config's parts over tp). Shaping the ops is compile.shape_front_end's (every op at
seq = cp); this module sizes the exchange.
NB: the loss's average over the cp ranks (one scalar) is not priced, as the catalog's.
"""

from trainsim.errors import ConfigError
from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.graph import Comm, Layer
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.megatron import cp_kv_exchange


def check_context_parallel(model: ModelSpec, dev: DeviceSlice, frontend: str) -> None:
    """Context parallelism splits each sequence cp ways and sizes the attention's keys and values from the
    model's shape: ConfigError where cp does not divide seq_len (tp x cp under sp), or the graph has no shape."""
    if dev.cp == 1:
        return
    if not isinstance(model, TransformerSpec):
        raise ConfigError("cp", dev.cp, f"the {frontend} front-end's graph has no model shape (a Hugging Face "
                          "config) to size the attention's keys and values from; use cp=1")
    parts = dev.cp * (dev.tp if dev.sp else 1)
    if dev.seq_len % parts:
        raise ConfigError("seq_len", dev.seq_len, f"context parallelism splits each sequence over cp={dev.cp}"
                          f"{f' and tp={dev.tp} (sp)' if dev.sp else ''}: give a seq_len divisible by {parts}")


def context_parallel_comms(model: ModelSpec, dev: DeviceSlice, whole: Layer, shaped: Layer) -> tuple[Comm, ...]:
    """The collectives over cp of one layer instance (shaped: one rank's share, at its configs over tp; whole: the
    captured layer): per attention core, the keys and values of the whole sequence of its tp rank's heads
    all-gathered forward, their gradient reduce-scattered backward (module doc)."""
    if dev.cp == 1:
        return ()
    assert isinstance(model, TransformerSpec)  # check_context_parallel
    act = BYTES_PER_DTYPE[dev.precision.activation_dtype]
    forward: list[Comm] = []
    backward: list[Comm] = []
    for op, ran in zip(whole.fwd, shaped.fwd, strict=True):
        if op.kind != "attention" or len(op.shape) != 4:
            continue
        heads_share = ran.shape[0] / op.shape[0]  # the core's (batch x) heads on this tp rank
        kv_bytes = dev.micro_batch * dev.seq_len * model.kv_features * act * heads_share
        gathers, scatters = cp_kv_exchange(dev.cp, kv_bytes)
        forward += [Comm(name, s.collective, "cp", "fwd", s.buffer_bytes) for name, s, _ in gathers]
        backward += [Comm(name, s.collective, "cp", "bwd", s.buffer_bytes) for name, s, _ in scatters]
    return tuple(forward + backward[::-1])
