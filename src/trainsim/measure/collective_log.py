"""The collectives a rank issues while a block of code runs (a training step), as (collective, bytes) rows in the
predictor's terms (ir.graph.Comm: an all-gather's bytes are the gathered buffer's, a reduce-scatter's the input
buffer's, an all-reduce's and an all-to-all's the tensor's), whichever API issued them: torch.distributed's calls
(the explicit autograd collectives) and DTensor's functional collectives both reach the dispatcher as c10d ops,
where a TorchDispatchMode sees them (torch.distributed.tensor.debug.CommDebugMode watches the same ops; it counts
them, this keeps their sizes). Imported only inside measure workers (torch).
"""

from collections import Counter
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

Row = tuple[str, int]  # (collective, bytes)

# op name -> (collective, the argument holding the buffer: an index, or -1 for the op's output)
_OPS = {
    ("c10d", "allreduce_"): ("all-reduce", 0),
    ("c10d", "allgather_"): ("all-gather", 0),  # the output parts
    ("c10d", "_allgather_base_"): ("all-gather", 0),  # the output tensor
    ("c10d", "reduce_scatter_"): ("reduce-scatter", 1),  # the input parts
    ("c10d", "_reduce_scatter_base_"): ("reduce-scatter", 1),
    ("c10d", "alltoall_"): ("all-to-all", 1),
    ("c10d", "alltoall_base_"): ("all-to-all", 1),
    ("_c10d_functional", "all_reduce"): ("all-reduce", 0),
    ("_c10d_functional", "all_gather_into_tensor"): ("all-gather", -1),
    ("_c10d_functional", "reduce_scatter_tensor"): ("reduce-scatter", 0),
    ("_c10d_functional", "all_to_all_single"): ("all-to-all", 0),
}


class CollectiveLog(TorchDispatchMode):
    """Inside `with CollectiveLog() as log:` every collective this thread dispatches (the backward's too: autograd
    runs a CPU backward on the calling thread) is appended to log.rows."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Row] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(issubclass(t, DTensor) for t in types):  # as CommDebugMode does: DTensor runs its op first, and
            return NotImplemented  # the collectives it issues on local tensors come back here
        out = func(*args, **(kwargs or {}))
        found = _OPS.get((func.namespace, func._schema.name.split("::")[-1]))
        if found is not None:
            collective, where = found
            self.rows.append((collective, _bytes(out if where < 0 else args[where])))
        return out

    def counts(self) -> Counter[Row]:
        return Counter(self.rows)


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0
