"""The catalog front-end: any catalog ModelSpec -> OpGraph, dispatched on the model kind."""

from collections.abc import Callable
from typing import Any

from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.registry import Registry
from trainsim.strategy.device_slice import DeviceSlice

BUILDERS: Registry[Callable[[Any, DeviceSlice], OpGraph]] = Registry("model kind")


def _register_builders() -> None:
    from trainsim.frontends.catalog.transformer import build_transformer

    BUILDERS.add("transformer", build_transformer)
    BUILDERS.add("cnn", _build_cnn)
    BUILDERS.add("dlrm", _build_dlrm)


# NB: the CNN and DLRM builders load when such a model is built, not with every transformer's prediction
def _build_cnn(model: Any, dev: DeviceSlice) -> OpGraph:
    from trainsim.frontends.catalog.cnn import build_cnn

    return build_cnn(model, dev)


def _build_dlrm(model: Any, dev: DeviceSlice) -> OpGraph:
    from trainsim.frontends.catalog.dlrm import build_dlrm

    return build_dlrm(model, dev)


_register_builders()


def build_graph(model: ModelSpec, dev: DeviceSlice) -> OpGraph:
    return BUILDERS.get(model.kind)(model, dev)
