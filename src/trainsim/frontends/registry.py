"""The front-ends, one registry: each turns what the user named with --model (its `source`) into the two things
the pipeline needs, the ModelSpec a Job is made of and the per-device OpGraph of that job.

    catalog  a catalog name, a model YAML/JSON, a Hugging Face config.json or a folder holding one
    torch    the same transformers traced through PyTorch, or FILE.py:factory / module:factory returning an
             nn.Module
    jax      FILE.py:factory or module:factory returning (train_step_fn, example_args)
    trace    a PyTorch execution-trace file or a directory of them (one per rank, with Kineto traces)

Each front-end honours the job's strategy where it can and refuses, with a ConfigError naming the field and
value, a strategy it cannot build. Heavy dependencies (torch, transformers, jax) are imported inside the
front-end that needs them; a missing one is a one-line ConfigError with the pip command. Add a front-end with
FRONTENDS.add(name, frontend).
"""

from dataclasses import dataclass
from typing import Any, Protocol

from trainsim.frontends.catalog.frontend import CatalogFrontend
from trainsim.frontends.jax.frontend import JaxFrontend
from trainsim.frontends.torch.frontend import TorchFrontend
from trainsim.frontends.trace.frontend import TraceFrontend
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.registry import Registry
from trainsim.strategy.precision import Precision


class Frontend(Protocol):
    name: str

    def model_spec(self, source: str) -> ModelSpec:
        """The model description a Job needs (see each front-end for what it derives)."""
        ...

    def graph(self, source: str, job: Job) -> OpGraph:
        """The OpGraph one device of the job computes per micro-batch (strategy.device_slice.DeviceSlice)."""
        ...

    def job_defaults(self, source: str) -> dict[str, Any]:
        """Job settings the source fixes (a trace: its ranks and micro-batch), used where the user gave none."""
        ...

    def inspect(self, source: str, micro_batch: int, seq_len: int, precision: Precision) -> OpGraph:
        """What `trainsim graph` shows: the graph of one device without model parallelism (one_device_graph),
        or for a trace the lowest rank as it ran."""
        ...


FRONTENDS: Registry[Frontend] = Registry("frontend")
MODEL_HELP = ("catalog name, model YAML, Hugging Face config.json or folder; FILE.py:factory (torch, jax); an "
              "execution-trace file or directory (trace)")
for _frontend in (CatalogFrontend(), TorchFrontend(), JaxFrontend(), TraceFrontend()):
    FRONTENDS.add(_frontend.name, _frontend)


@dataclass(frozen=True, slots=True)
class ModelSource:
    """What the user named as the model (`source`, the --model value) and the front-end that reads it."""

    source: str
    frontend: str = "catalog"

    def __post_init__(self) -> None:
        FRONTENDS.get(self.frontend)  # unknown names: one line listing the choices

    def model_spec(self) -> ModelSpec:
        return FRONTENDS.get(self.frontend).model_spec(self.source)

    def graph(self, job: Job) -> OpGraph:
        return FRONTENDS.get(self.frontend).graph(self.source, job)

    def job_defaults(self) -> dict[str, Any]:
        return FRONTENDS.get(self.frontend).job_defaults(self.source)
