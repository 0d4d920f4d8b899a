"""`trainsim search`: the ranked plans as a table with the tally of refused plans, or one JSON object."""

from typing import Any

from rich import box
from rich.table import Table

from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec
from trainsim.report.rich_text import to_text
from trainsim.search.planner import RankedStrategy, SearchReport
from trainsim.search.space import SearchSpace
from trainsim.units import format_duration

# NB: rich falls back to 80 columns when stdout is a pipe or a file; the table is wider than that.
PIPE_WIDTH = 160


def plan_to_dict(plan: RankedStrategy) -> dict[str, Any]:
    result = plan.result
    return {
        "rank": plan.rank,
        "strategy": plan.parallel.model_dump(),
        "description": plan.parallel.describe(),
        "iteration_time_s": result.iteration_time_s,
        "tokens_per_s": result.tokens_per_s,
        "samples_per_s": result.samples_per_s,
        "tflops_per_gpu": result.tflops_per_gpu,
        "mfu": result.mfu,
        "hfu": result.hfu,
        "peak_memory_gib": result.peak_memory_gib,
        "band": result.band.to_dict(result) if result.band is not None else None,
        "memory_capacity_gib": result.memory_capacity_bytes / 2**30,
        "breakdown": result.breakdown,
    }


def search_to_dict(report: SearchReport) -> dict[str, Any]:
    """The --json object: the best plans, and how many plans were tried, feasible, and refused per reason."""
    return {"plans": [plan_to_dict(plan) for plan in report.plans], "tried": report.tried,
            "feasible": report.feasible, "infeasible": report.infeasible}


def plans_table(report: SearchReport) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    experts = any(plan.parallel.ep > 1 for plan in report.plans)  # an ep column where a plan spreads its experts
    for name in ("#", "tp", "pp", "dp", *(["ep"] if experts else []), "vpp", "sp", "zero", "recompute", "mb"):
        table.add_column(name, justify="left" if name == "recompute" else "right", no_wrap=True)
    for name in ("iteration", "tokens/s", "MFU", "peak GiB"):
        table.add_column(name, justify="right", no_wrap=True)
    for plan in report.plans:
        par, result = plan.parallel, plan.result
        table.add_row(
            str(plan.rank), str(par.tp), str(par.pp), str(par.dp), *([str(par.ep)] if experts else []),
            str(par.vpp), "on" if par.sp else "off",
            str(par.zero), par.recompute, str(par.micro_batch), format_duration(result.iteration_time_s),
            f"{result.tokens_per_s:,.0f}", f"{result.mfu * 100:.1f}%", f"{result.peak_memory_gib:.1f}",
        )
    return table


def summary_lines(report: SearchReport) -> list[str]:
    lines = [f"tried {report.tried} plans: {report.feasible} feasible, "
             f"{report.tried - report.feasible} infeasible"]
    lines += [f"  {reason:<16}{count:>8}" for reason, count in report.infeasible.items()]
    if not report.plans:
        lines.append("no feasible plan: change the global batch, the number of GPUs or the sequence length")
    return lines


def render_search(report: SearchReport, model: ModelSpec, cluster: ClusterSpec, space: SearchSpace,
                  terminal: bool = False) -> str:
    """A title naming the search, the table of the best plans (if any), then the tally."""
    title = (f"{model.name} on {cluster.name} ({cluster.num_gpus} GPUs), global batch "
             f"{space.global_batch} x {space.seq_len} tokens, {space.precision}: "
             f"best {len(report.plans)} by tokens/s")
    table = [plans_table(report)] if report.plans else []
    return to_text(title, *table, *summary_lines(report), width=None if terminal else PIPE_WIDTH,
                   terminal=terminal)


PLAN_COLUMNS = (("#", "rank"), ("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("ep", "ep"), ("vpp", "vpp"),
                ("sp", "sp"), ("zero", "zero"), ("recompute", "recompute"), ("mb", "micro_batch"))


def _energy_text(kwh: float) -> str:
    return f"{kwh:,.0f}" if kwh >= 100 else f"{kwh:.3g}"


def rows_table(plans: list[dict[str, Any]]) -> tuple[Table, str]:
    """The best plans of a search's JSON object (plan_to_dict's layout), and a line naming the settings every
    plan shown shares: their columns are left out, so the table fits an 80-column terminal."""
    def cell(plan: dict[str, Any], key: str) -> str:
        value = plan["rank"] if key == "rank" else plan["strategy"][key]
        return ("on" if value else "off") if key == "sp" else str(value)

    # ep only where a plan shown has experts over more than one rank (a dense search reads as before)
    columns = [(name, key) for name, key in PLAN_COLUMNS
               if key != "ep" or any(plan["strategy"].get("ep", 1) > 1 for plan in plans)]
    shared = [(name, key) for name, key in columns[1:]
              if len(plans) > 1 and len({cell(plan, key) for plan in plans}) == 1]
    shown = [(name, key) for name, key in columns if (name, key) not in shared]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, _ in shown:
        table.add_column(name, justify="left" if name == "recompute" else "right", no_wrap=True)
    train = plans[0].get("time_to_train_s") is not None
    cost = plans[0].get("cost_to_train") is not None
    energy = plans[0].get("energy_to_train_kwh") is not None
    extra = [*(["train h"] if train else []), *(["cost"] if cost else []), *(["kWh"] if energy else [])]
    for name in ("iteration", "tokens/s", "MFU", "peak GiB", *extra):
        table.add_column(name, justify="right", no_wrap=True)
    for plan in plans:
        more = [*([f"{plan['time_to_train_s'] / 3600:,.1f}"] if train else []),
                *([f"{plan['cost_to_train']:,.0f}"] if cost else []),
                *([_energy_text(plan["energy_to_train_kwh"])] if energy else [])]
        table.add_row(*(cell(plan, key) for _, key in shown), format_duration(plan["iteration_time_s"]),
                      f"{plan['tokens_per_s']:,.0f}", f"{plan['mfu'] * 100:.1f}%", f"{plan['peak_memory_gib']:.1f}",
                      *more)
    note = ("every plan shown: " + ", ".join(f"{name} {cell(plans[0], key)}" for name, key in shared)) if shared else ""
    return table, note


def render_search_data(data: dict[str, Any], terminal: bool = False) -> str:
    """render_search of a search's JSON object (trainsim.api.SearchResult.to_dict())."""
    tried, feasible, infeasible = data["tried"], data["feasible"], data["infeasible"]
    lines = [f"tried {tried} plans: {feasible} feasible, {tried - feasible} infeasible"]
    lines += [f"  {reason:<16}{count:>8}" for reason, count in infeasible.items()]
    if not data["plans"]:
        lines.append("no feasible plan: change the global batch, the number of GPUs or the sequence length")
    items: list[Any] = []
    if data["plans"]:
        table, note = rows_table(data["plans"])
        items = [table, *([note] if note else [])]
    return to_text(data["title"], *items, *lines, width=None if terminal else PIPE_WIDTH, terminal=terminal)
