"""Stage collection and per-setting training as Ray tasks (`--ray ADDRESS`): each work item of
experiment.collect / experiment.evaluate / a setting's training becomes one remote call, the results come back
to this process (the database is written here only, so the workers need no shared file system).

Ray is an optional extra (`pip install trainsim[ray]`), imported when a RayRunner is made.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trainsim.errors import TrainsimError

INSTALL_HINT = "--ray needs Ray: pip install 'trainsim[ray]'"


def _ray() -> Any:
    try:
        import ray  # pyright: ignore[reportMissingImports]  (the optional `ray` extra)
    except ImportError:
        raise TrainsimError(INSTALL_HINT) from None
    return ray


@dataclass(slots=True)
class RayRunner:
    """Runs work items as Ray tasks on the cluster this process is connected to."""

    ray: Any
    num_cpus: float = 1.0

    @classmethod
    def connect(cls, address: str) -> "RayRunner":
        """Connect (ray.init) unless this process already is: `local` starts a Ray instance here."""
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(address=None if address == "local" else address, log_to_driver=False,
                         include_dashboard=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise TrainsimError(f"--ray {address}: cannot connect ({str(exc).splitlines()[0]})") from None
        return cls(ray)

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]],
            cpus: Sequence[float] | None = None) -> Iterator[tuple[int, Any]]:
        """Each item a task holding cpus[i] CPUs (a stage measurement holds one per rank, so that two
        measurements never share a node's cores: their timings would interfere)."""
        remote = self.ray.remote(num_cpus=self.num_cpus)(fn)
        largest = float(self.ray.cluster_resources().get("CPU", 1.0))  # more would wait forever
        pending = {remote.options(num_cpus=min(cpus[index] if cpus else self.num_cpus, largest)).remote(*args):
                   index for index, args in enumerate(items)}
        while pending:
            done, _ = self.ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), self.ray.get(ref)
