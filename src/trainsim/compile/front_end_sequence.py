"""Megatron-LM's sequence parallelism on a capturing front-end's graph (Korthikanti et al. 2022, Sec. 4.2.2;
Proteus Sec. IV-B and V-B: sequence parallelism as splits, its collectives what resharding between them inserts).

Under sp (`--sp`, tp > 1) a layer of a captured graph reads and hands on its hidden state split by sequence over
tp (strategy.megatron.handed_on, as the catalog's layers), so the ops outside the tensor-parallel regions (norms,
dropouts, residual adds: the ops a tree leaves unconfigured, whose configs are inferred along the data
dependencies) keep each rank's sequence share; the column-parallel matmul reading whole features has its input
all-gathered, and an op the tree does not configure reading the partial sums of a row-parallel matmul reads them
reduce-scattered by sequence (sequence_parallel_config) instead of all-reduced (Megatron-LM's
reduce_scatter_to_sequence_parallel_region, megatron/core/tensor_parallel/mappings.py, megatron-core 0.9). The
backward runs the conjugates (strategy.reshard). A config the tree gives is kept as given (parts 1: whole, the
hidden state gathered before it), as on the catalog's graph.

Memory: a matmul reading a sequence split gathered keeps its input as its producer holds it, each rank its
sequence share (kept_parts): Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication saves the sharded
input under sequence_parallel (megatron/core/tensor_parallel/layers.py, megatron-core 0.9), as the catalog counts
it (Korthikanti et al. 2022, Table 2: sbh/t (34 + 5as/h)). NB: Megatron-LM all-gathers that input again in the
backward for the weight gradient; neither front-end prices that gather (the catalog's pattern lists one
all-gather and one reduce-scatter per column/row pair and direction).
"""

from trainsim.errors import ConfigError
from trainsim.ir.graph import Op
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.placement import CONTRACTING, OpConfig, Placement


def check_sequence_parallel(dev: DeviceSlice) -> None:
    """Sequence parallelism splits each sequence tp ways: ConfigError where tp does not divide seq_len."""
    if dev.sp and dev.seq_len % dev.tp:
        raise ConfigError("seq_len", dev.seq_len, f"sequence parallelism splits each sequence over tp={dev.tp}: "
                          f"give a seq_len divisible by {dev.tp}, or no --sp")


def sequence_parallel_config(op: Op, inferred: OpConfig, held: Placement, dev: DeviceSlice) -> OpConfig:
    """An op's inferred config (compile.splits.inferred_config, from the input placement `held`) under sp: an op
    that is not a matmul reading partial sums over whole features reads them reduce-scattered by sequence
    (Megatron's row-parallel output); any other config as inferred."""
    if not dev.sp or op.kind in CONTRACTING or held.partial == 1 or inferred.out > 1:
        return inferred
    return OpConfig(inferred.batch, inferred.seq * held.partial, 1, 1)


def kept_parts(op: Op, config: OpConfig, held: Placement | None, dev: DeviceSlice, reads_reduce: bool) -> int:
    """The parts of its input an op keeps for its backward (its input's parts at its config: batch x seq x its
    reduction features where it reads them, reads_reduce: a matmul with a weight, else its output features); under
    sp such a matmul reading a sequence split gathered keeps its producer's share (module doc). held: the placement
    of the first tensor it reads (None: none)."""
    parts = config.batch * config.seq * (config.reduce if reads_reduce else config.out)
    if not dev.sp or op.kind != "matmul" or not reads_reduce or held is None or held.partial > 1:
        return parts
    tokens = held.batch * held.seq
    return max(parts, tokens * config.reduce) if tokens > config.batch * config.seq else parts
