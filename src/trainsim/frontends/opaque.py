"""The model description of a source that carries none (a jax train step, an nn.Module without a config, an
execution trace): an OpaqueSpec, for which make_job allows data and pipeline parallelism, and tp for a strategy
tree's splits of the captured ops (cp = ep = 1; the front-end and compile.shape_front_end refuse tp where they
cannot split); the OpGraph holds the model itself."""

from trainsim.ir.model_spec import OpaqueSpec


def opaque_spec(name: str, origin: str, params: float | None = None) -> OpaqueSpec:
    return OpaqueSpec(name=name, published_params=params, source=origin,
                      description=f"a model known only from its {origin}: no layer structure (dp, pp; tp by a tree)")
