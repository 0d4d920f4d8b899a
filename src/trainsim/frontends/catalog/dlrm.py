"""Analytic builder: DlrmSpec + DeviceSlice -> OpGraph (per device, forward and backward).

Naumov et al. 2019: sparse features go through embedding-bag lookups, dense features through the bottom MLP;
a dot interaction (pairwise dot products of the 1 + num_tables feature vectors) feeds the top MLP. Layers in
order: embeddings (sparse), bottom MLP, interaction, top MLP with the loss. micro_batch = samples per device;
dev.tp and dev.cp are ignored (the caller refuses them for DLRM). Embedding tables are not sharded here:
this is the graph of one data-parallel replica holding every table.
"""

from trainsim.errors import ConfigError
from trainsim.hardware.device import BYTES_PER_DTYPE
from trainsim.ir.flops import matmul_backward, matmul_op, pointwise_backward, pointwise_op
from trainsim.ir.graph import Layer, LayerKind, Op, OpGraph
from trainsim.ir.model_spec import DlrmSpec, EmbeddingTable
from trainsim.strategy.device_slice import DeviceSlice

_EMBEDDING_BYTES = 4  # fp32 embedding rows
_INDEX_BYTES = 8  # int64 lookup indices


def build_dlrm(spec: DlrmSpec, dev: DeviceSlice) -> OpGraph:
    dim = _check_dims(spec)
    features = spec.num_tables + 1  # the bottom-MLP output joins the pooled embeddings
    interaction_out = features * (features - 1) // 2 + dim  # pairwise dots (no self-interaction) + dense
    layers = (
        _embeddings(spec, dev),
        _mlp("bottom_mlp", "mlp", spec.dense_features, spec.bottom_mlp, dev, last_relu=True, first=True),
        _interaction(spec, dev, features, dim, interaction_out),
        _mlp("top_mlp", "head", interaction_out, spec.top_mlp, dev, last_relu=False, first=False),
    )
    return OpGraph(spec.name, layers, dev.micro_batch, dev.micro_batch)


def _check_dims(spec: DlrmSpec) -> int:
    """The dot interaction needs every table dim equal to the bottom MLP's output width."""
    dims = {table.dim for table in spec.tables}
    width = spec.bottom_mlp[-1] if spec.bottom_mlp else spec.dense_features
    if dims != {width}:
        raise ConfigError(f"model {spec.name}.tables.dim", sorted(dims),
                          f"the dot interaction needs every table dim equal to the bottom MLP output {width}")
    return width


def _act_bytes(dev: DeviceSlice) -> int:
    return BYTES_PER_DTYPE[dev.precision.activation_dtype]


def _lookup_op(index: int, table: EmbeddingTable, batch: int) -> Op:
    """Embedding-bag forward: B * pooling_factor rows of dim fp32 values read per table, summed.

    NB: memory bound; bytes count the rows read (the pooled output write is small next to them for pooled
    features and is left out, as in Lin et al.'s lookup model before reuse factors).
    """
    lookups = batch * table.pooling_factor * table.count
    moved = lookups * table.dim * _EMBEDDING_BYTES
    return Op(f"lookup{index}", "embedding", f"embeddings.table{index}", "fwd", "fp32", lookups * table.dim,
              moved, (batch, table.count, table.dim))


def _lookup_backward(op: Op) -> Op:
    """NB: the sparse gradient update reads and writes each looked-up row: twice the forward bytes."""
    return Op(op.name + ".bwd", op.kind, op.module_path, "bwd", op.dtype, op.flops, op.bytes_moved * 2.0,
              op.shape)


def _embeddings(spec: DlrmSpec, dev: DeviceSlice) -> Layer:
    batch = dev.micro_batch
    fwd = tuple(_lookup_op(i, table, batch) for i, table in enumerate(spec.tables))
    bwd = tuple(_lookup_backward(op) for op in reversed(fwd))
    params = float(sum(table.rows * table.dim * table.count for table in spec.tables))
    indices = sum(batch * table.pooling_factor * table.count for table in spec.tables) * _INDEX_BYTES
    output = batch * sum(table.dim * table.count for table in spec.tables) * _act_bytes(dev)
    return Layer("embeddings", "sparse", 1, fwd, bwd, (), params, params,
                 {"none": indices, "selective": indices, "full": indices}, output)


def _mlp(name: str, kind: LayerKind, width_in: int, widths: tuple[int, ...], dev: DeviceSlice,
         last_relu: bool, first: bool) -> Layer:
    """Linear layers with ReLU between them; the top MLP ends in a sigmoid and the binary cross-entropy."""
    batch, lin, act = dev.micro_batch, dev.precision.linear_dtype, dev.precision.activation_dtype
    fwd: list[Op] = []
    saved = 0.0
    params = 0
    prev = width_in
    for i, width in enumerate(widths):
        path = f"{name}.{i}"
        fwd.append(matmul_op(f"linear{i}", path, lin, batch, width, prev))
        saved += batch * prev  # the linear layer's input
        params += prev * width + width
        if last_relu or i < len(widths) - 1:
            fwd.append(pointwise_op(f"relu{i}", "elementwise", f"{path}.relu", act, batch * width))
        prev = width
    if not last_relu:
        fwd.append(pointwise_op("sigmoid_bce", "loss", f"{name}.loss", "fp32", batch * prev,
                                flops_per_element=6.0))
    bwd: list[Op] = []
    for index, op in enumerate(reversed(fwd)):
        if op.kind == "matmul":
            dgrad, wgrad = matmul_backward(op)
            # The dense input features need no gradient.
            bwd.extend([wgrad] if first and index == len(fwd) - 1 else [dgrad, wgrad])
        else:
            bwd.append(pointwise_backward(op))
    act_bytes = _act_bytes(dev)
    saved_bytes = saved * act_bytes
    full = batch * width_in * act_bytes
    output = batch * prev * act_bytes if last_relu else 0.0
    return Layer(name, kind, 1, tuple(fwd), tuple(bwd), (), float(params), float(params),
                 {"none": saved_bytes, "selective": saved_bytes, "full": full}, output)


def _interaction(spec: DlrmSpec, dev: DeviceSlice, features: int, dim: int, width_out: int) -> Layer:
    """Stack the features to (B, F, d), Z = T T^T as a batched matmul, keep the strict lower triangle, and
    concatenate the dense vector.

    NB: both gradients of Z = T T^T land on T; the generic matmul backward (two matmuls) matches that count.
    """
    batch, act = dev.micro_batch, dev.precision.activation_dtype
    fwd = [
        pointwise_op("stack", "elementwise", "interaction.stack", act, batch * features * dim,
                     flops_per_element=0.0),
        matmul_op("dot", "interaction.dot", dev.precision.matmul_dtype, features, features, dim, batch=batch),
        pointwise_op("gather_cat", "elementwise", "interaction.gather", act, batch * width_out,
                     flops_per_element=0.0),
    ]
    bwd: list[Op] = []
    for op in reversed(fwd):
        bwd.extend(matmul_backward(op) if op.kind == "matmul" else (pointwise_backward(op),))
    act_bytes = _act_bytes(dev)
    stacked = batch * features * dim * act_bytes  # T, kept for the backward of the dot products
    return Layer("interaction", "interaction", 1, tuple(fwd), tuple(bwd), (), 0.0, 0.0,
                 {"none": stacked, "selective": stacked, "full": stacked}, batch * width_out * act_bytes)
