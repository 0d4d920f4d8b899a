"""The model description of a source that carries none (a jax train step, an nn.Module without a config, an
execution trace): an OpaqueSpec, for which make_job allows only data and pipeline parallelism (tp = cp = ep = 1),
what these front-ends can honour; the OpGraph holds the model itself."""

from trainsim.ir.model_spec import OpaqueSpec


def opaque_spec(name: str, origin: str, params: float | None = None) -> OpaqueSpec:
    return OpaqueSpec(name=name, published_params=params, source=origin,
                      description=f"a model known only from its {origin}: no layer structure (dp and pp only)")
