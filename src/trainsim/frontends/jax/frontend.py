"""The jax front-end as a pipeline peer: FILE.py:factory or module:factory, called as
factory(micro_batch=..., seq_len=..., precision=...) and returning (train_step_fn, example_args).

The jaxpr is the whole step of one device (OpGraph.frontend "jax"): tensor parallelism takes a strategy tree's
configs over tp on its ops, addressed by their name-stack paths (compile.shape_front_end; tp > 1 without one is
refused there); sp, cp and ep are refused, naming the field. The model description is opaque (frontends.opaque):
the jaxpr carries no spec."""

from typing import Any

from trainsim.errors import ConfigError
from trainsim.frontends.one_device import one_device_graph
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision

PIP = "pip install 'trainsim[jax]'"


def refuse_model_parallelism(par: ParallelSpec, frontend: str) -> None:
    """sp, cp and ep split a model the front-end cannot split: refuse them, naming the field (tp is taken: a
    strategy tree's configs over tp split the captured ops, compile.shape_front_end)."""
    for field, value, default in (("sp", par.sp, False), ("cp", par.cp, 1), ("ep", par.ep, 1)):
        if value != default:
            raise ConfigError(field, value, f"the {frontend} front-end cannot split the model; use {field}="
                              f"{default} (dp and pp apply; tp applies through a strategy tree's splits)")


class JaxFrontend:
    name = "jax"

    def job_defaults(self, source: str) -> dict[str, Any]:
        del source
        return {}

    def model_spec(self, source: str) -> ModelSpec:
        location, _, attr = source.rpartition(":")
        if not location or not attr:
            raise ConfigError("model", source, "the jax front-end takes path/to/file.py:factory or module:factory")
        return opaque_spec(attr, "jax train step", split_by_tree=True)

    def graph(self, source: str, job: Job) -> OpGraph:
        par = job.parallel
        refuse_model_parallelism(par, self.name)
        try:
            from trainsim.frontends.jax.capture import graph_from_jax_target
        except ModuleNotFoundError as exc:
            raise ConfigError("frontend", self.name, f"needs {exc.name} ({PIP})") from None
        return graph_from_jax_target(source, micro_batch=par.micro_batch, seq_len=par.seq_len,
                                     precision=par.precision)

    def inspect(self, source: str, micro_batch: int, seq_len: int, precision: Precision) -> OpGraph:
        return one_device_graph(self, source, micro_batch, seq_len, precision)
