"""A measured sharded-DLRM run (`trainsim measure --sharder/--sharding`) as text: the iteration, the host's load,
and per span the wall and thread CPU milliseconds of every rank in the median iteration."""

from typing import Any


def render_dlrm_run(record: dict[str, Any]) -> str:
    ms = 1e3
    lines = [f"{record['model']}: {record['sharder']} on {record['num_ranks']} ranks, local batch "
             f"{record['local_batch']}",
             f"iteration {record['iteration_s'] * ms:.3f} ms (median of {len(record['iterations_s'])}; p10 "
             f"{record['p10_s'] * ms:.3f}, p90 {record['p90_s'] * ms:.3f}); host 1-minute load "
             f"{record['load_avg'][0]:.2f} -> {record['load_avg'][1]:.2f}",
             "span (ms, median iteration)  " + "  ".join(f"r{r} wall / cpu" for r in range(record["num_ranks"]))]
    events, cpus = record["rank_events"], record["rank_cpu_s"]
    for index, (name, _, _) in enumerate(events[0]):
        cells = []
        for rank_events, rank_cpu in zip(events, cpus, strict=True):
            _, start, end = rank_events[index]
            cells.append(f"{(end - start) * ms:8.3f} / {rank_cpu[index] * ms:7.3f}")
        lines.append(f"{name:<28} " + "  ".join(cells))
    return "\n".join(lines) + "\n"


def render_campaign(rows: list[dict[str, Any]]) -> str:
    """A DLRM campaign's configs (`trainsim measure --generated/--dlrm-tasks`): per config the median and fastest
    iteration of the slowest rank and the host's 1-minute load before and after its group."""
    lines = [f"{'task':<16} {'ranks':>5} {'sharder':<20} {'batch':>6} {'median ms':>10} {'fastest ms':>10}  load"]
    for row in rows:
        lines.append(f"{row['task']:<16} {row['ranks']:>5} {row['sharder']:<20} {row['local_batch']:>6} "
                     f"{float(row['measured_s']) * 1e3:10.2f} {float(row['fastest_s']) * 1e3:10.2f}  "
                     f"{float(row['load_before']):.1f}->{float(row['load_after']):.1f}")
    return "\n".join(lines) + "\n"
