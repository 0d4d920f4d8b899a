"""The model description of a source that carries none (a jax train step, an execution trace).

NB: the ModelSpec kinds are transformer, cnn and dlrm. A source without a layer structure is described as a cnn
with no layers: make_job then allows only data and pipeline parallelism (tp = cp = ep = 1), which is what these
front-ends can honour; the OpGraph holds the model itself."""

from trainsim.ir.model_spec import CnnSpec


def opaque_spec(name: str, origin: str, params: float | None = None) -> CnnSpec:
    return CnnSpec(name=name, layers=(), published_params=params, source=origin,
                   description=f"a model known only from its {origin}: no layer structure (dp and pp only)")
