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
    try:
        from trainsim.frontends.catalog.cnn import build_cnn
        from trainsim.frontends.catalog.dlrm import build_dlrm
    except ImportError:  # pragma: no cover - the CNN/DLRM builders ship with the package
        return
    BUILDERS.add("cnn", build_cnn)
    BUILDERS.add("dlrm", build_dlrm)


_register_builders()


def build_graph(model: ModelSpec, dev: DeviceSlice) -> OpGraph:
    return BUILDERS.get(model.kind)(model, dev)
