"""The jax front-end as a pipeline peer: FILE.py:factory or module:factory, called as
factory(micro_batch=..., seq_len=..., precision=...) and returning (train_step_fn, example_args).

The jaxpr is the whole step of one device (OpGraph.frontend "jax"): tensor parallelism takes a strategy tree's
configs over tp on its ops, addressed by their name-stack paths (compile.shape_front_end; tp > 1 without one is
refused there), and sp the torch front-end's sequence-parallel pass on them (compile.front_end_sequence). The
model description is opaque (frontends.opaque): the jaxpr carries no spec, so cp and ep are refused in one line when
the job is made (context parallelism sizes the keys and values it exchanges from the model's shape and exchanges
them at the attention cores, compile.front_end_context; a jaxpr has neither, its attention being einsums), and
here too (a Job made by hand), naming the field."""

from typing import Any

from trainsim.errors import ConfigError
from trainsim.frontends.one_device import one_device_graph
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.strategy.precision import Precision

PIP = "pip install 'trainsim[jax]'"


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
        if par.cp != 1:
            raise ConfigError("cp", par.cp, f"the {self.name} front-end's jaxpr has no model shape nor attention "
                              "core to exchange keys and values at (its attention is einsums); use cp=1")
        if par.ep != 1:
            raise ConfigError("ep", par.ep, f"the {self.name} front-end cannot split a model's experts; use ep=1")
        try:
            from trainsim.frontends.jax.capture import graph_from_jax_target
        except ModuleNotFoundError as exc:
            raise ConfigError("frontend", self.name, f"needs {exc.name} ({PIP})") from None
        return graph_from_jax_target(source, micro_batch=par.micro_batch, seq_len=par.seq_len,
                                     precision=par.precision)

    def inspect(self, source: str, micro_batch: int, seq_len: int, precision: Precision) -> OpGraph:
        return one_device_graph(self, source, micro_batch, seq_len, precision)
