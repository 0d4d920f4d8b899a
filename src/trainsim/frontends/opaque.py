"""The model description of a source that carries none (a jax train step, an nn.Module without a config, an
execution trace): an OpaqueSpec, for which make_job allows data and pipeline parallelism, and tp where the graph
keeps module paths a strategy tree's configs address (split_by_tree: the torch and JAX front-ends' captures); cp =
ep = 1. The OpGraph holds the model itself."""

from trainsim.ir.model_spec import OpaqueSpec


def opaque_spec(name: str, origin: str, params: float | None = None, split_by_tree: bool = False,
                no_tp_reason: str = "") -> OpaqueSpec:
    """split_by_tree: the graph keeps module paths, so tp applies through a tree's configs over tp. no_tp_reason:
    otherwise, what the source lacks for it (make_job's refusal of tp says it)."""
    allowed = "dp, pp, and tp through a strategy tree's configs" if split_by_tree else "dp and pp only"
    return OpaqueSpec(name=name, published_params=params, source=origin, split_by_tree=split_by_tree,
                      no_tp_reason=no_tp_reason,
                      description=f"a model known only from its {origin}: no layer structure ({allowed})")
