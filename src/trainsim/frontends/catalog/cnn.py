"""Analytic builder: CnnSpec + DeviceSlice -> OpGraph (per device, forward and backward).

One Layer per block of the spec (the `block` of its layers); consecutive blocks of identical shapes (ResNet's
repeated bottlenecks, Inception's Mixed_6c/6d) are stored once with a repeat count. Data parallel only: the
caller refuses tensor and context parallelism for CNNs, so dev.tp and dev.cp are ignored.
"""

from dataclasses import dataclass, replace

from trainsim.hardware.device import BYTES_PER_DTYPE, DType
from trainsim.ir.flops import (
    conv_backward,
    conv_op,
    matmul_backward,
    matmul_op,
    pointwise_backward,
    pointwise_op,
)
from trainsim.ir.graph import Layer, LayerKind, Op, OpGraph
from trainsim.ir.model_spec import CnnSpec, ConvLayer
from trainsim.strategy.device_slice import DeviceSlice


@dataclass(frozen=True, slots=True)
class _Member:
    """A layer of the spec with what the builder infers from its neighbours."""

    layer: ConvLayer
    # NB: a conv followed by a norm has no bias (the norm's shift replaces it); an fc always has one.
    has_bias: bool


def build_cnn(spec: CnnSpec, dev: DeviceSlice) -> OpGraph:
    blocks = _blocks(spec)
    layers: list[Layer] = []
    signatures: list[tuple[object, ...]] = []
    for index, (name, members) in enumerate(blocks):
        signature = tuple((m.layer.type, m.layer.in_channels, m.layer.out_channels, m.layer.kernel,
                           m.layer.stride, m.layer.out_hw, m.has_bias) for m in members)
        is_last = index == len(blocks) - 1
        if signatures and signatures[-1] == signature and not is_last and len(layers) > 1:
            previous = layers[-1]
            first_name = previous.name.split("..")[0]
            layers[-1] = _renamed(previous, f"{first_name}..{name}", previous.count + 1)
            continue
        layers.append(_block_layer(name, members, dev, first=index == 0, last=is_last))
        signatures.append(signature)
    return OpGraph(spec.name, tuple(layers), dev.micro_batch, dev.micro_batch)


def _blocks(spec: CnnSpec) -> list[tuple[str, list[_Member]]]:
    """Consecutive layers with the same `block` form one block (a layer without one is its own block)."""
    blocks: list[tuple[str, list[_Member]]] = []
    layers = spec.layers
    for i, layer in enumerate(layers):
        follower = layers[i + 1] if i + 1 < len(layers) else None
        before_norm = follower is not None and follower.type == "norm"
        has_bias = layer.type == "fc" or (layer.type == "conv" and not before_norm)
        member = _Member(layer, has_bias)
        name = layer.block or layer.name
        if blocks and blocks[-1][0] == name and layer.block:
            blocks[-1][1].append(member)
        else:
            blocks.append((name, [member]))
    return blocks


def _renamed(layer: Layer, name: str, count: int) -> Layer:
    return Layer(name, layer.kind, count, layer.fwd, layer.bwd, layer.comms, layer.param_count,
                 layer.full_param_count, layer.saved_bytes, layer.output_bytes)


def _in_hw(layer: ConvLayer) -> tuple[int, int]:
    """NB: the input size is taken as out_hw * stride for convs and pools ('same' padding)."""
    if layer.type in ("conv", "pool"):
        return layer.out_hw[0] * layer.stride, layer.out_hw[1] * layer.stride
    return layer.out_hw


def _in_elements(layer: ConvLayer, batch: int) -> int:
    if layer.type == "fc":
        return batch * layer.in_channels
    h, w = _in_hw(layer)
    return batch * layer.in_channels * h * w


def _out_elements(layer: ConvLayer, batch: int) -> int:
    return batch * layer.out_channels * layer.out_hw[0] * layer.out_hw[1]


def _params(member: _Member) -> int:
    layer = member.layer
    if layer.type in ("conv", "fc"):
        weights = layer.in_channels * layer.out_channels * layer.kernel[0] * layer.kernel[1]
        return weights + (layer.out_channels if member.has_bias else 0)
    if layer.type == "norm":
        return 2 * layer.out_channels  # BatchNorm scale and shift (running statistics are buffers)
    return 0


def _forward_op(member: _Member, dev: DeviceSlice, conv_dtype: DType) -> Op:
    layer, batch, act = member.layer, dev.micro_batch, dev.precision.activation_dtype
    path, out = layer.name, _out_elements(layer, dev.micro_batch)
    if layer.type == "conv":  # the geometry rides in Op.kernel, for the conv microbenchmark (profile/ops.py)
        op = conv_op(layer.name, path, conv_dtype, batch, layer.in_channels, layer.out_channels,
                     layer.kernel, layer.stride, layer.out_hw, _in_hw(layer))
        return replace(op, kernel=f"{layer.kernel[0]}x{layer.kernel[1]}s{layer.stride}")
    if layer.type == "fc":
        return matmul_op(layer.name, path, dev.precision.linear_dtype, batch, layer.out_channels,
                         layer.in_channels)
    if layer.type == "norm":
        # NB: training-mode batch norm reads its input twice (statistics, then normalize) and writes once.
        return pointwise_op(layer.name, "norm", path, act, out, reads=2.0, flops_per_element=5.0)
    if layer.type == "pool":
        window = layer.kernel[0] * layer.kernel[1]
        op = pointwise_op(layer.name, "pool", path, act, out, reads=_in_elements(layer, batch) / out,
                          flops_per_element=float(window))
        mode = "avg" if "avg" in layer.name else "max"
        return replace(op, kernel=f"{mode}{layer.kernel[0]}x{layer.kernel[1]}s{layer.stride}"
                       f"o{layer.out_hw[0]}x{layer.out_hw[1]}")
    if layer.type == "concat":
        return pointwise_op(layer.name, "elementwise", path, act, out, flops_per_element=0.0)
    return pointwise_op(layer.name, "elementwise", path, act, out)  # relu


def _backward(fwd: list[Op], first: bool) -> tuple[Op, ...]:
    """Reverse order; the model's first conv/fc skips its input gradient (the images need none)."""
    bwd: list[Op] = []
    for index, op in enumerate(reversed(fwd)):
        is_input_op = first and index == len(fwd) - 1
        if op.kind == "conv":
            dgrad, wgrad = conv_backward(op)
            bwd.extend([wgrad] if is_input_op else [dgrad, wgrad])
        elif op.kind == "matmul":
            dgrad, wgrad = matmul_backward(op)
            bwd.extend([wgrad] if is_input_op else [dgrad, wgrad])
        else:
            bwd.append(pointwise_backward(op))
    return tuple(bwd)


def _saved_elements(members: list[_Member], batch: int) -> float:
    """Inputs kept for backward by conv, fc, norm and pool layers.

    NB: ReLU runs in place, so its saved output is the next layer's saved input (not counted twice), and the
    block input read by several branches (Inception) or by the shortcut (ResNet) is counted once.
    """
    first = members[0].layer
    block_input = (first.in_channels, _in_hw(first))
    counted_block_input = False
    total = 0.0
    for member in members:
        layer = member.layer
        if layer.type not in ("conv", "fc", "norm", "pool"):
            continue
        if layer.type != "fc" and (layer.in_channels, _in_hw(layer)) == block_input:
            if counted_block_input:
                continue
            counted_block_input = True
        total += _in_elements(layer, batch)
    return total


def _block_layer(name: str, members: list[_Member], dev: DeviceSlice, first: bool, last: bool) -> Layer:
    # NB: convolutions run in the 16-bit dtype under fp8 (frameworks have no fp8 conv kernels).
    conv_dtype = dev.precision.matmul_dtype
    batch, act_bytes = dev.micro_batch, BYTES_PER_DTYPE[dev.precision.activation_dtype]
    fwd = [_forward_op(member, dev, conv_dtype) for member in members]
    has_fc = any(m.layer.type == "fc" for m in members)
    saved = _saved_elements(members, batch) * act_bytes
    if last and has_fc:
        classes = members[-1].layer.out_channels
        fwd.append(pointwise_op("cross_entropy", "loss", "head.loss", "fp32", batch * classes,
                                flops_per_element=4.0))
        saved += batch * classes * 4.0  # fp32 softmax
    kind: LayerKind = "conv_block" if any(m.layer.type == "conv" for m in members) else "mlp"
    if last:
        kind = "head"
    params = float(sum(_params(member) for member in members))
    full = _in_elements(members[0].layer, batch) * act_bytes  # the block input only
    output = 0.0 if last else _out_elements(members[-1].layer, batch) * act_bytes
    return Layer(name, kind, 1, tuple(fwd), _backward(fwd, first), (), params, params,
                 {"none": saved, "selective": saved, "full": full}, output)
