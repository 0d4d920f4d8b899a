"""One iteration of a measured DLRM rank (measure.dlrm_rank) recorded as the rank's PyTorch execution trace and
Kineto trace: the input of Lin et al.'s predictive trace simulation through the trace front-end
(frontends.trace.dlrm_predicted; Sec. III-D, Algorithm 1 takes per-rank execution traces).

torch.profiler's ExecutionTraceObserver with record_shapes, its step boundaries set by the iteration's hooks: the
ProfilerStep opens just after the barrier that starts the iteration and closes after its last step, so that
barrier is not in the trace (Lin et al. Sec. IV: "a barrier at the beginning of each batch"); a second barrier
right after the profiler starts (a c10d barrier, the trace's first collective) lines the ranks up again, since
starting the profiler takes each rank a different time (up to a second on this host). Files: FOLDER/
rank<R>.et.json.gz and rank<R>.kineto.json.gz (frontends.trace.load.find_trace_files pairs them). Imported only
in a rank's process (torch).
"""

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainsim.measure.dlrm_rank import IterationHooks


def traced_iteration(step: Iterator[dict[str, Any]], hooks: IterationHooks, rank: int, folder: str,
                     barrier: Callable[[], Any]) -> dict[str, Any]:
    """The next iteration of `step` (a config_iterations iterator whose hooks are `hooks`) under the profiler;
    its record as config_iterations yields it (iteration_s: the traced iteration's own wall time). barrier: the
    process group's (torch.distributed.barrier)."""
    import warnings

    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    warnings.filterwarnings("ignore", message="Profiler won't be using warmup")

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    et_path, kineto_path = out / f"rank{rank}.et.json", out / f"rank{rank}.kineto.json"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    # wait one step (the profiler idle until the barrier has passed), record one, save it when the next begins
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=0, active=1),
                 record_shapes=True, execution_trace_observer=observer,
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(kineto_path))) as prof:
        def start() -> None:
            prof.step()
            barrier()  # the ranks' profilers start at different times: realigned before the first op

        hooks.start, hooks.end = start, prof.step
        try:
            record = next(step)
        finally:
            hooks.clear()
    observer.unregister_callback()
    for path in (et_path, kineto_path):
        _compress(path)
    return record


def _compress(path: Path) -> None:
    """path -> path.gz (compact JSON), the plain file removed."""
    with gzip.open(path.with_name(path.name + ".gz"), "wt", compresslevel=6) as handle:
        handle.write(json.dumps(json.loads(path.read_text()), separators=(",", ":")))
    path.unlink()
