"""What a search ranks by, beyond throughput: memory headroom, and the time, cost and energy to train a number
of tokens; a floor on the headroom.

For a fixed cluster size the time to train N tokens (N / tokens per second), its cost (GPUs x hours x price) and
its energy (GPUs x the device's maximum power x time: DeviceSpec.max_power_w, stated per device in the catalog
with its datasheet; an upper bound on the GPUs' own draw, hosts, network and cooling left out) fall as
throughput rises, so those objectives rank the plans as throughput does: they add the time, cost and energy to
every plan (the energy where the device states its power). memory-headroom ranks by the memory left free on
the fullest GPU (most first), ties broken by throughput. --min-headroom refuses, under the reason "memory
headroom", plans that leave less free.
"""

from dataclasses import replace
from typing import Any, Literal

from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec
from trainsim.job import make_job
from trainsim.search.planner import Planner, PricedPlan, RankedStrategy, SearchReport

Objective = Literal["throughput", "time-to-train", "cost", "energy", "memory-headroom"]
OBJECTIVES: tuple[str, ...] = ("throughput", "time-to-train", "cost", "energy", "memory-headroom")
JOULES_PER_KWH = 3.6e6
HEADROOM_REFUSAL = "memory headroom"
GIB = 2**30


def check_objective(objective: str, tokens: float | None, price_per_gpu_hour: float | None,
                    min_headroom_gib: float | None) -> None:
    if objective not in OBJECTIVES:
        raise ConfigError("objective", objective, "choose one of: " + ", ".join(OBJECTIVES))
    for name, value in (("tokens", tokens), ("price_per_gpu_hour", price_per_gpu_hour)):
        if value is not None and not (isinstance(value, int | float) and 0 < value < float("inf")):
            raise ConfigError(name, value, "must be a positive finite number")
    if min_headroom_gib is not None and not (isinstance(min_headroom_gib, int | float) and
                                             0 <= min_headroom_gib < float("inf")):
        raise ConfigError("min_headroom", min_headroom_gib, "must be a finite number of GiB >= 0")
    if objective in ("time-to-train", "cost", "energy") and tokens is None:
        raise ConfigError("tokens", None, f"--objective {objective} needs --tokens N (tokens to train)")
    if objective == "cost" and price_per_gpu_hour is None:
        raise ConfigError("price_per_gpu_hour", None, "--objective cost needs --price-per-gpu-hour")


def check_energy(objective: str, cluster: ClusterSpec) -> None:
    """--objective energy needs the device's power, stated in the catalog (max_power_w)."""
    if objective == "energy" and cluster.device.max_power_w is None:
        raise ConfigError("objective", objective, f"device {cluster.device.name} states no max_power_w in the "
                          "catalog: use a cluster YAML whose device has one, or another objective")


def rerank(report: SearchReport, planner: Planner, model: ModelSpec, cluster: ClusterSpec, objective: str,
           min_headroom_gib: float | None, top_k: int) -> SearchReport:
    """The report's best top_k by `objective` among the plans that fit with at least min_headroom_gib free."""
    if objective != "memory-headroom" and min_headroom_gib is None:
        return report  # the planner ranked by throughput already
    capacity = cluster.device.hbm_bytes
    floor = (min_headroom_gib or 0.0) * GIB
    fits = [(index, plan) for index, plan in enumerate(report.priced) if not plan.oom]
    admitted = [(index, plan) for index, plan in fits if capacity - plan.peak_memory_bytes >= floor]
    low = len(fits) - len(admitted)

    def key(entry: tuple[int, PricedPlan]) -> tuple[float, float, int]:
        index, plan = entry
        if objective == "memory-headroom":
            return (plan.peak_memory_bytes, -plan.tokens_per_s, index)
        return (-plan.tokens_per_s, plan.peak_memory_bytes, index)

    best = sorted(admitted, key=key)[:top_k]
    ranked = []
    for rank, (_, plan) in enumerate(best, start=1):
        job = make_job(model, cluster, plan.parallel)
        ranked.append(RankedStrategy(rank, job, planner.estimator.estimate(job, planner.graphs.get(job))))
    infeasible = dict(report.infeasible)
    if low:
        infeasible[HEADROOM_REFUSAL] = low
    return replace(report, plans=ranked, feasible=report.feasible - low, infeasible=infeasible)


def plan_extras(row: dict[str, Any], num_gpus: int, capacity_gib: float, tokens: float | None,
                price_per_gpu_hour: float | None, power_w: float | None = None) -> dict[str, Any]:
    """The objective's numbers for one plan row: headroom, and with tokens the time (with a price the cost,
    with the device's power the energy) to train them."""
    extras: dict[str, Any] = {"headroom_gib": capacity_gib - row["peak_memory_gib"]}
    if tokens is not None:
        seconds = tokens / row["tokens_per_s"]
        extras["time_to_train_s"] = seconds
        if price_per_gpu_hour is not None:
            extras["cost_to_train"] = seconds / 3600 * num_gpus * price_per_gpu_hour
        if power_w is not None:
            extras["energy_to_train_kwh"] = seconds * num_gpus * power_w / JOULES_PER_KWH
    return extras
