"""The model description of a source that carries none (a jax train step, an nn.Module without a config, an
execution trace): an OpaqueSpec, for which make_job allows only data and pipeline parallelism (tp = cp = ep = 1),
what these front-ends can honour; the OpGraph holds the model itself."""

from trainsim.ir.model_spec import OpaqueSpec


def opaque_spec(name: str, origin: str, params: float | None = None, split_by_tree: bool = False) -> OpaqueSpec:
    """split_by_tree: the graph keeps module paths, so tp applies through a tree's configs over tp."""
    allowed = "dp, pp, and tp through a strategy tree's configs" if split_by_tree else "dp and pp only"
    return OpaqueSpec(name=name, published_params=params, source=origin, split_by_tree=split_by_tree,
                      description=f"a model known only from its {origin}: no layer structure ({allowed})")
