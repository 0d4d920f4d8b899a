"""The catalog front-end: a catalog name, a model YAML/JSON, a Hugging Face config.json or a folder holding one
-> ModelSpec -> the analytic builders (catalog.build). Every strategy the builders know is honoured."""

from pathlib import Path
from typing import Any

from trainsim.catalog import load_model
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.build import build_graph
from trainsim.frontends.one_device import one_device_graph
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import Precision


def resolve_source(source: str) -> str:
    """A Hugging Face model folder stands for its config.json; anything else is returned as it is."""
    path = Path(source)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ConfigError("model", source, "a model folder must hold a Hugging Face config.json")
        return str(config)
    return source


class CatalogFrontend:
    name = "catalog"

    def job_defaults(self, source: str) -> dict[str, Any]:
        del source
        return {}

    def model_spec(self, source: str) -> ModelSpec:
        return load_model(resolve_source(source))

    def graph(self, source: str, job: Job) -> OpGraph:
        """Built from job.model (the spec model_spec(source) gave, which the job was checked against)."""
        del source
        return build_graph(job.model, DeviceSlice.of(job.parallel, job.stack))

    def inspect(self, source: str, micro_batch: int, seq_len: int, precision: Precision) -> OpGraph:
        return one_device_graph(self, source, micro_batch, seq_len, precision)
