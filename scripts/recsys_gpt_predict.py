"""The NLP check of Lin et al.'s predictive trace simulation on this machine: the small GPTs traced by
scripts/recsys_gpt_trace.py (2 gloo ranks, DDP) predicted by Algorithm 1 with kernel models and host overheads
fitted on the OTHER traced sizes (leave one size out), collectives from the local gloo sweep's sigmoid curves;
compared with the measured iteration (untraced iterations, median of the slowest rank) and with the replay of
the size's own trace; each also with the profiler's own cost per recorded op taken out (`-prof`:
frontends.trace.predicted.profiler_op_s, fitted on the other sizes' traced against untraced iterations).

    python scripts/recsys_gpt_predict.py [ROOT [MEASURED]]   # reads ROOT/*/ (default data/recsys/cpu/gpt); the
                                                             # measured iterations from MEASURED/*/measured.json
                                                             # (a second pass of the same configs) if given
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from recsys_experiments import CLUSTER, local_curves

from trainsim.estimate.trace_predict import iteration_s
from trainsim.frontends.trace.load import load_trace_directory
from trainsim.frontends.trace.predicted import (
    KernelModels,
    deduct_profiler,
    host_overheads,
    op_samples,
    predicted_trace_graph,
    profiler_op_s,
)
from trainsim.frontends.trace.to_exec_graph import to_exec_graph

ROOT = Path("data/recsys/cpu/gpt")


def main(root: Path = ROOT, measured_root: Path | None = None) -> None:
    dirs = sorted(d for d in root.iterdir() if (d / "measured.json").exists())
    traces = {d.name: load_trace_directory(d) for d in dirs}
    measured = {d.name: json.loads((d / "measured.json").read_text())["iteration_s"] for d in dirs}
    # the profiler's cost is fitted against the traced pass's own untraced iterations; the errors against
    # `target` (a second pass, when given)
    target = measured if measured_root is None else {
        d.name: json.loads((measured_root / d.name / "measured.json").read_text())["iteration_s"] for d in dirs}
    comm = local_curves()

    def collective_s(kind: str, nbytes: float, ranks: int) -> float:
        # NB: gloo's broadcast and barrier priced as an all-reduce of their bytes (the sweep has all-reduce and
        # all-to-all curves only)
        name = "all-to-all" if kind == "all-to-all" else "all-reduce"
        return comm.collective_time_s(name, max(nbytes, 4.0), CLUSTER.group_layout(ranks, 1), CLUSTER)

    columns = ("predicted", "replay", "predicted-prof", "replay-prof")
    print(f"{'config':<10} {'measured ms':>11} " + " ".join(f"{c + ' ms':>17} {'error':>7}" for c in columns)
          + "  profiler us/op")
    errors: dict[str, list[float]] = {c: [] for c in columns}
    for name, rank_traces in traces.items():
        others = [t for other, ts in traces.items() if other != name for t in ts]
        kernels = KernelModels.fit(op_samples(others))
        overheads = host_overheads([to_exec_graph(ts) for other, ts in traces.items() if other != name])
        # the profiler's cost per recorded op, from the OTHER sizes' traced and untraced iterations
        per_op = profiler_op_s([(ts, measured[other]) for other, ts in traces.items() if other != name])
        times = {"predicted": iteration_s(predicted_trace_graph(rank_traces, kernels, overheads, collective_s)),
                 "replay": iteration_s(to_exec_graph(rank_traces, start_offsets="zero")),
                 "predicted-prof": iteration_s(deduct_profiler(predicted_trace_graph(
                     rank_traces, kernels, overheads, collective_s), rank_traces, per_op)),
                 "replay-prof": iteration_s(deduct_profiler(to_exec_graph(rank_traces, start_offsets="zero"),
                                                            rank_traces, per_op))}
        cells = []
        for column in columns:
            err = times[column] / target[name] - 1.0
            errors[column].append(abs(err))
            cells.append(f"{times[column] * 1e3:17.2f} {err * 100:+6.1f}%")
        print(f"{name:<10} {target[name] * 1e3:11.2f} " + " ".join(cells) + f"  {per_op * 1e6:.1f}")
    print("geomean |error| (mean, max): " + "; ".join(
        f"{c} {float(np.exp(np.mean(np.log(np.maximum(v, 1e-6))))) * 100:.2f}% ({np.mean(v) * 100:.2f}%, "
        f"{max(v) * 100:.2f}%)"
        for c, v in errors.items()))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT, Path(sys.argv[2]) if len(sys.argv) > 2 else None)
