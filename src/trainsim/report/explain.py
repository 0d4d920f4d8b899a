"""--explain: the critical path of a simulated iteration and the exposed time per communication type."""

from trainsim.ir.exec_graph import ExecGraph
from trainsim.sim import SimOutcome
from trainsim.units import format_duration

TOP_TASKS = 12


def render_explain(graph: ExecGraph, outcome: SimOutcome) -> str:
    path = outcome.critical_path
    start, end = outcome.start_s, outcome.end_s
    by_category: dict[str, float] = {}
    for tid in path:
        task = graph.tasks[tid]
        by_category[task.category or task.kind] = by_category.get(task.category or task.kind, 0.0) + \
            end[tid] - start[tid]
    on_path = sum(by_category.values())
    lines = [f"critical path: {len(path)} tasks, {format_duration(on_path)} of work over a "
             f"{format_duration(outcome.makespan_s)} iteration (the rest is waiting on the path)"]
    for category, seconds in sorted(by_category.items(), key=lambda item: -item[1]):
        lines.append(f"  {category:<14}{format_duration(seconds):>12}  {seconds / outcome.makespan_s * 100:5.1f}%")
    lines.append(f"longest tasks on the critical path (of {len(path)}):")
    longest = sorted(path, key=lambda tid: start[tid] - end[tid])[:TOP_TASKS]
    for tid in sorted(longest, key=lambda tid: start[tid]):
        task = graph.tasks[tid]
        lines.append(f"  {format_duration(start[tid]):>10} +{format_duration(end[tid] - start[tid]):>10}  "
                     f"device {task.device} {task.stream:<8} {task.name}")
    lines.append("exposed communication per type (longest over devices; compute idle meanwhile):")
    comm = {k: v for k, v in outcome.exposed_s.items() if k.endswith("_comm")}
    if not comm:
        lines.append("  none")
    for category, seconds in sorted(comm.items(), key=lambda item: -item[1]):
        lines.append(f"  {category:<14}{format_duration(seconds):>12}")
    return "\n".join(lines)
