"""The torch front-end as a pipeline peer. Sources:

- a catalog transformer name or model YAML (mapped to its Hugging Face family, torch.hf.hf_config_from_spec), a
  Hugging Face config.json or a folder holding one: the model is built with transformers and traced;
- FILE.py:factory or module:factory: the factory (given micro_batch, seq_len, precision where it declares them)
  returns an nn.Module taking input_ids and labels of (micro_batch, seq_len), or (module, example_inputs).

model_spec: the TransformerSpec of the Hugging Face config (catalog.hf_config), for a factory that of its
module's `config`; a module without one is opaque (frontends.opaque: dp, pp, and tp by a tree).
graph: the traced step, lowered to the kernels a fused training stack runs (torch.fuse). The trace is one
device's whole model (OpGraph.frontend "torch"): tensor parallelism takes a strategy tree's configs over tp on its
ops, addressed by module path (compile.shape_front_end: tp > 1 without one is refused there), and sequence
parallelism splits the hidden state between them by sequence (compile.front_end_sequence); a Mixtral-shaped
mixture of experts is traced with balanced routing and split over ep at tp=1 and cp=1 (torch.moe: E / ep experts
a rank, the all-to-alls over ep); ep with tp or cp > 1 and the unfused "math" attention are refused, naming the
field (the trace runs one device's whole sequence through SDPA); dp, pp, ZeRO and recompute are priced on the
traced graph as the catalog's are.
"""

from dataclasses import replace
from pathlib import Path
from typing import Any

from trainsim.catalog import load_model
from trainsim.catalog.files import read_mapping
from trainsim.catalog.hf_config import model_from_hf_config
from trainsim.errors import ConfigError, TrainsimError, exception_reason
from trainsim.frontends.catalog.frontend import resolve_source
from trainsim.frontends.factory import call_factory, is_factory_target, load_factory
from trainsim.frontends.one_device import one_device_graph
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import Layer, OpGraph
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import Precision

PIP = "pip install torch==2.13.0 transformers"


def missing(exc: ModuleNotFoundError) -> ConfigError:
    return ConfigError("frontend", "torch", f"needs {exc.name} ({PIP})")


class TorchFrontend:
    name = "torch"

    def job_defaults(self, source: str) -> dict[str, Any]:
        del source
        return {}

    def model_spec(self, source: str) -> ModelSpec:
        if is_factory_target(source):
            config = _module_config(_build_module(source, micro_batch=1, seq_len=1, precision="fp32"))
            attr = source.rpartition(":")[2]
            if config is None:
                return opaque_spec(attr, "nn.Module factory", split_by_tree=True)
            return model_from_hf_config(config, name=str(config.get("_name_or_path") or attr), where=source)
        spec = load_model(resolve_source(source))
        if not isinstance(spec, TransformerSpec):
            raise ConfigError("model", source, f"is a {spec.kind}; the torch front-end takes transformers")
        return spec

    def graph(self, source: str, job: Job) -> OpGraph:
        dev = DeviceSlice.of(job.parallel, job.stack)
        _check_strategy(dev)
        try:
            traced = _trace(source, job, dev)
        except ModuleNotFoundError as exc:
            raise missing(exc) from None
        return _with_kernel(traced, dev)

    def inspect(self, source: str, micro_batch: int, seq_len: int, precision: Precision) -> OpGraph:
        return one_device_graph(self, source, micro_batch, seq_len, precision)


def _check_strategy(dev: DeviceSlice) -> None:
    if dev.ep != 1 and dev.tp * dev.cp != 1:
        raise ConfigError("ep", dev.ep, "the torch front-end splits a captured MoE's experts over ep at tp=1 and "
                          "cp=1 only; use ep=1, or tp=1 and cp=1")
    if not dev.fused_attention:
        raise ConfigError("attention", dev.attention, "the torch front-end traces fused SDPA attention; "
                          "choose flash2 or flash3")


def _trace(source: str, job: Job, dev: DeviceSlice) -> OpGraph:
    from trainsim.frontends.torch.hf import graph_from_hf_config, hf_config_from_spec

    shape = {"micro_batch": dev.micro_batch, "seq_len": dev.seq_len, "precision": job.parallel.precision}
    if is_factory_target(source):
        graph = _trace_factory(source, job, dev.ep)
    else:
        path = resolve_source(source)
        if path.endswith(".json"):
            config: dict[str, Any] = read_mapping(Path(path))
        elif isinstance(job.model, TransformerSpec):
            config = hf_config_from_spec(job.model)
        else:
            raise ConfigError("model", source, f"is a {job.model.kind}; the torch front-end takes transformers")
        graph = graph_from_hf_config(config, name=job.model.name, fused=True, ep=dev.ep, **shape)
    if isinstance(job.model, TransformerSpec) and job.model.is_moe:
        from trainsim.frontends.torch.moe import moe_layers

        return moe_layers(graph, job.model, dev)
    return graph


def _trace_factory(source: str, job: Job, ep: int) -> OpGraph:
    from trainsim.frontends.torch.capture import TensorSpec, graph_from_module

    par = job.parallel
    made = _build_module(source, ep, micro_batch=par.micro_batch, seq_len=par.seq_len, precision=par.precision)
    module, inputs = made if isinstance(made, tuple) else (made, None)
    if inputs is None:
        inputs = {"input_ids": TensorSpec((par.micro_batch, par.seq_len), "int64"),
                  "labels": TensorSpec((par.micro_batch, par.seq_len), "int64")}
    return graph_from_module(module, inputs, precision=par.precision, micro_batch=par.micro_batch,
                             seq_len=par.seq_len, name=job.model.name, fused=True)


def _build_module(source: str, ep: int = 1, **shape: Any) -> Any:
    """The factory's result, built under FakeTensorMode (no weight is allocated); a module with Mixtral's
    experts traces balanced routing, E / ep of them (torch.moe)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ModuleNotFoundError as exc:
        raise missing(exc) from None
    from trainsim.frontends.torch.moe import is_moe_config, with_balanced_routing

    factory = load_factory(source, "torch")
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            made = call_factory(factory, **shape)
            module = made[0] if isinstance(made, tuple) else made
            if is_moe_config(getattr(module, "config", None)):
                with_balanced_routing(module, ep)  # under the mode its weights are fakes of
    except TrainsimError:
        raise
    except Exception as exc:  # the user's factory failed: one line, never a traceback
        reason = exception_reason(exc)
        raise ConfigError("model", source, f"the factory raised {type(exc).__name__}: {reason}") from exc
    if not callable(getattr(module, "named_parameters", None)):
        raise ConfigError("model", source, "the factory must return an nn.Module or (nn.Module, example_inputs)")
    return made


def _module_config(made: Any) -> dict[str, Any] | None:
    module = made[0] if isinstance(made, tuple) else made
    config = getattr(module, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    mapping = to_dict()
    return {str(key): value for key, value in mapping.items()} if isinstance(mapping, dict) else None


def _with_kernel(graph: OpGraph, dev: DeviceSlice) -> OpGraph:
    """Attention ops run the job's kernel (flash2 or flash3), as the catalog builder's do."""
    def layer(one: Layer) -> Layer:
        return replace(one, fwd=tuple(replace(op, kernel=dev.attention) if op.kind == "attention" else op
                                      for op in one.fwd),
                       bwd=tuple(replace(op, kernel=dev.attention) if op.kind == "attention" else op
                                 for op in one.bwd))

    return replace(graph, layers=tuple(layer(one) for one in graph.layers))
