"""The NLP check of Lin et al.'s predictive trace simulation on this machine: the small GPTs traced by
scripts/recsys_gpt_trace.py (2 gloo ranks, DDP) predicted by Algorithm 1 with kernel models and host overheads
fitted on the OTHER traced sizes (leave one size out), collectives from the local gloo sweep's sigmoid curves
($COLLECTIVES_DB, as scripts/recsys_experiments.local_curves); compared with the measured iteration (untraced
iterations, median of the slowest rank) and with the replay of the size's own trace; each also with the
profiler's own cost per recorded op taken out (`-prof`: frontends.trace.predicted.profiler_op_s, fitted on the
other sizes' traced against untraced iterations).

Where the runs timed measure.phase's reference probe (recsys_gpt_trace.py since the seventeenth session), a second
table puts every run at one speed of the host ("phase-normalised"): a size's traces are dilated by (campaign
reference / the probe around its traced iteration) and its untraced median scaled by (campaign reference / the
median probe around its untraced iterations); a probe is the slowest rank's mean of the probes before and
after an iteration, the campaign reference the median of every size's untraced one. The header lines give, per
size, the traced iteration's inflation over the untraced median and the part the probe ascribes to the host's
phase.

    python scripts/recsys_gpt_predict.py [ROOT [MEASURED[,MEASURED...]]]   # reads ROOT/*/ (default
        # data/recsys/cpu/gpt); the measured iteration from MEASURED/*/measured.json (other passes of the same
        # configs) if given: the median of every listed pass's iterations (slowest rank) pooled
"""

import json
import statistics
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
    dilate_traces,
    host_overheads,
    op_samples,
    predicted_trace_graph,
    profiler_op_s,
)
from trainsim.frontends.trace.rank_trace import RankTrace
from trainsim.frontends.trace.to_exec_graph import to_exec_graph

ROOT = Path("data/recsys/cpu/gpt")
COLUMNS = ("predicted", "replay", "predicted-prof", "replay-prof")


def _reference_s(rank_probes: list[list[float]]) -> float:
    """An iteration's probe: the slowest rank's mean of its probes before and after."""
    return max(statistics.fmean(pair) for pair in rank_probes)


def untraced_reference_s(record: dict) -> float:
    per_iteration = zip(*record["rank_probes_s"], strict=True)
    return statistics.median(_reference_s(list(ranks)) for ranks in per_iteration)


def traced_reference_s(record: dict) -> float:
    return _reference_s(record["rank_traced_probes_s"])


def _collective_s(kind: str, nbytes: float, ranks: int) -> float:
    # NB: gloo's broadcast and barrier priced as an all-reduce of their bytes (the sweep has all-reduce and
    # all-to-all curves only)
    name = "all-to-all" if kind == "all-to-all" else "all-reduce"
    return COMM.collective_time_s(name, max(nbytes, 4.0), CLUSTER.group_layout(ranks, 1), CLUSTER)


COMM = local_curves()


def size_times(name: str, traces: dict[str, list[RankTrace]], measured: dict[str, float]) -> dict[str, float]:
    """The four predictions of size `name`, every fit on the other sizes only."""
    rank_traces = traces[name]
    others = {other: ts for other, ts in traces.items() if other != name}
    kernels = KernelModels.fit(op_samples([t for ts in others.values() for t in ts]))
    overheads = host_overheads([to_exec_graph(ts) for ts in others.values()])
    per_op = profiler_op_s([(ts, measured[other]) for other, ts in others.items()])

    def predicted():
        return predicted_trace_graph(rank_traces, kernels, overheads, _collective_s)

    def replay():
        return to_exec_graph(rank_traces, start_offsets="zero")

    return {"predicted": iteration_s(predicted()), "replay": iteration_s(replay()),
            "predicted-prof": iteration_s(deduct_profiler(predicted(), rank_traces, per_op)),
            "replay-prof": iteration_s(deduct_profiler(replay(), rank_traces, per_op)), "profiler_op_s": per_op}


def table(title: str, traces: dict[str, list[RankTrace]], measured: dict[str, float],
          target: dict[str, float]) -> None:
    print(title)
    print(f"{'config':<16} {'measured ms':>11} " + " ".join(f"{c + ' ms':>17} {'error':>7}" for c in COLUMNS)
          + "  profiler us/op")
    errors: dict[str, list[float]] = {c: [] for c in COLUMNS}
    for name in traces:
        times = size_times(name, traces, measured)
        cells = []
        for column in COLUMNS:
            err = times[column] / target[name] - 1.0
            errors[column].append(abs(err))
            cells.append(f"{times[column] * 1e3:17.2f} {err * 100:+6.1f}%")
        print(f"{name:<16} {target[name] * 1e3:11.2f} " + " ".join(cells) + f"  {times['profiler_op_s'] * 1e6:.1f}")
    print("geomean |error| (mean, max): " + "; ".join(
        f"{c} {float(np.exp(np.mean(np.log(np.maximum(v, 1e-6))))) * 100:.2f}% ({np.mean(v) * 100:.2f}%, "
        f"{max(v) * 100:.2f}%)"
        for c, v in errors.items()))


def slowest_rank_s(record: dict) -> list[float]:
    return [max(ranks) for ranks in zip(*record["rank_iterations_s"], strict=True)]


def pooled_median_s(records: list[dict], scales: list[float]) -> float:
    """The median (upper, as recsys_gpt_trace.py's) of the passes' slowest-rank iterations, each pass's times
    by its scale."""
    pooled = sorted(t * scale for r, scale in zip(records, scales, strict=True) for t in slowest_rank_s(r))
    return pooled[len(pooled) // 2]


def main(root: Path = ROOT, measured_roots: list[Path] | None = None) -> None:
    dirs = sorted(d for d in root.iterdir() if (d / "measured.json").exists())
    records = {d.name: json.loads((d / "measured.json").read_text()) for d in dirs}
    traces = {d.name: load_trace_directory(d) for d in dirs}
    measured = {name: r["iteration_s"] for name, r in records.items()}
    # the profiler's cost is fitted against the traced pass's own untraced iterations; the errors against
    # `target` (other passes, pooled, when given)
    second = None if not measured_roots else {
        name: [json.loads((m / name / "measured.json").read_text()) for m in measured_roots] for name in records}
    target = measured if second is None else {name: pooled_median_s(rs, [1.0] * len(rs)) for name, rs in
                                              second.items()}
    if second is not None:
        gaps = [abs(np.log(target[name] / measured[name])) for name in records]
        print("pass to pass (the measured passes' untraced median over the traced pass's): " + ", ".join(
            f"{name} {target[name] / measured[name] - 1.0:+.1%}" for name in records)
              + f"; geomean |log ratio| {float(np.exp(np.mean(np.log(gaps)))):.2%}, max {max(gaps):.2%}\n")
    table("raw: traces as recorded, the untraced median as measured", traces, measured, target)
    if not all("rank_probes_s" in r for r in records.values()):
        return
    untraced = {name: untraced_reference_s(r) for name, r in records.items()}
    reference = statistics.median(untraced.values())
    print(f"\nreference probe: campaign {reference * 1e3:.3f} ms; per size: traced iteration / untraced median "
          "(load 1 min before), probe around the traced / median untraced")
    for name, r in records.items():
        traced_s = max(r["rank_traced_s"])
        print(f"  {name:<16} {traced_s / r['iteration_s']:5.2f}x (load {r['load_before'][0]:4.1f})  "
              f"probe {traced_reference_s(r) / untraced[name]:5.2f}x")
    inflation = [np.log(max(r["rank_traced_s"]) / r["iteration_s"]) for r in records.values()]
    probe_ratio = [np.log(traced_reference_s(r) / untraced[name]) for name, r in records.items()]
    print(f"  corr(log inflation, log probe ratio) over sizes: {np.corrcoef(inflation, probe_ratio)[0, 1]:+.2f}")
    pairs = [pair for r in records.values() for rank in r["rank_probes_s"] for pair in rank]
    print(f"  untraced iterations' probes, median: {statistics.median(p[0] for p in pairs) * 1e3:.3f} ms before the "
          f"barrier, {statistics.median(p[1] for p in pairs) * 1e3:.3f} ms after the step")
    for name, r in records.items():
        dilate_traces(traces[name], reference / traced_reference_s(r))
    scaled = {name: measured[name] * reference / untraced[name] for name in records}
    scaled_target = scaled if second is None else {
        name: pooled_median_s(rs, [reference / untraced_reference_s(r) for r in rs]) for name, rs in second.items()}
    table("\nphase-normalised: traces and untraced medians at the campaign's probe speed", traces, scaled,
          scaled_target)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT,
         [Path(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else None)
