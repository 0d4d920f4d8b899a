"""The NLP check of Lin et al.'s predictive trace simulation on this machine: the small GPTs traced by
scripts/recsys_gpt_trace.py (2 gloo ranks, DDP) predicted by Algorithm 1 with kernel models and host overheads
fitted on the OTHER traced sizes (leave one size out), collectives from the local gloo sweep's sigmoid curves;
compared with the measured iteration (untraced iterations, median of the slowest rank) and with the replay of
the size's own trace.

    python scripts/recsys_gpt_predict.py            # reads data/recsys/cpu/gpt/*/
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
    host_overheads,
    op_samples,
    predicted_trace_graph,
)
from trainsim.frontends.trace.to_exec_graph import to_exec_graph

ROOT = Path("data/recsys/cpu/gpt")


def main() -> None:
    dirs = sorted(d for d in ROOT.iterdir() if (d / "measured.json").exists())
    traces = {d.name: load_trace_directory(d) for d in dirs}
    measured = {d.name: json.loads((d / "measured.json").read_text())["iteration_s"] for d in dirs}
    comm = local_curves()

    def collective_s(kind: str, nbytes: float, ranks: int) -> float:
        # NB: gloo's broadcast and barrier priced as an all-reduce of their bytes (the sweep has all-reduce and
        # all-to-all curves only)
        name = "all-to-all" if kind == "all-to-all" else "all-reduce"
        return comm.collective_time_s(name, max(nbytes, 4.0), CLUSTER.group_layout(ranks, 1), CLUSTER)

    print(f"{'config':<10} {'measured ms':>11} {'predicted ms':>12} {'error':>7} {'replay ms':>10} {'error':>7}")
    errors, replay_errors = [], []
    for name, rank_traces in traces.items():
        others = [t for other, ts in traces.items() if other != name for t in ts]
        kernels = KernelModels.fit(op_samples(others))
        overheads = host_overheads([to_exec_graph(ts) for other, ts in traces.items() if other != name])
        predicted = iteration_s(predicted_trace_graph(rank_traces, kernels, overheads, collective_s))
        replay = iteration_s(to_exec_graph(rank_traces, start_offsets="zero"))
        err, rerr = predicted / measured[name] - 1.0, replay / measured[name] - 1.0
        errors.append(abs(err))
        replay_errors.append(abs(rerr))
        print(f"{name:<10} {measured[name] * 1e3:11.2f} {predicted * 1e3:12.2f} {err * 100:+6.1f}% "
              f"{replay * 1e3:10.2f} {rerr * 100:+6.1f}%")
    geo = float(np.exp(np.mean(np.log(np.maximum(errors, 1e-6)))))
    rgeo = float(np.exp(np.mean(np.log(np.maximum(replay_errors, 1e-6)))))
    print(f"geomean |error|: predicted {geo * 100:.2f}% (max {max(errors) * 100:.2f}%), "
          f"replay {rgeo * 100:.2f}% (max {max(replay_errors) * 100:.2f}%)")


if __name__ == "__main__":
    main()
