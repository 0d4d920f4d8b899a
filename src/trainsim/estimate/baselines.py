"""Engines "sim-plain" and "flexflow-sim": the simulator without what Proteus adds to it, for the paper's
comparisons (sim/baselines.py holds the switches).

- "sim-plain" is Fig. 9's Plain (Proteus Sec. VIII-D): the simulator without its runtime behaviour detector, so no
  overlap slow-down (gamma) and no bandwidth sharing between concurrent transfers; the same collectives (the
  calibrated NCCL model) and the plan's schedule as "sim".
- "flexflow-sim" is FlexFlow-Sim as Proteus re-implemented it (Sec. VIII-C, Table IV): the same task graph with
  the collectives inserted and the same op costs, no runtime behaviours, collectives priced from the link's
  bandwidth alone (sim/baselines.BandwidthOnlyComm: FlexFlow, Jia et al. 2019, Sec. 5.1) and no limit on the
  micro-batches in flight (FlexFlow's simulator runs each task as soon as its inputs are ready; a strategy tree's
  max_in_flight, Proteus' max_ongoing_micro_batch, is dropped).

Both return the simulator's Result (with its timeline) under their own engine name.
"""

import dataclasses

from trainsim.compile.context import TaskLevel
from trainsim.cost.pricing import Pricer
from trainsim.estimate.simulation import SimEstimator, SimRun, sim_calibration
from trainsim.ir.graph import OpGraph
from trainsim.job import Job
from trainsim.sim.baselines import RUNTIME_FLAGS, flexflow_pricer
from trainsim.strategy.lowered import LoweredPlan, default_plan


class PlainSimEstimator(SimEstimator):
    """Engine "sim-plain": the simulator with the overlap slow-down and bandwidth sharing off."""

    name = "sim-plain"

    def __init__(self, pricer: Pricer | None = None, *, task_level: TaskLevel = "layer") -> None:
        overlap, sharing = RUNTIME_FLAGS["plain"]
        super().__init__(pricer, overlap=overlap, sharing=sharing, task_level=task_level)


class FlexFlowSimEstimator(SimEstimator):
    """Engine "flexflow-sim": the plain simulator with bandwidth-only collectives and no in-flight limit."""

    name = "flexflow-sim"

    def __init__(self, pricer: Pricer | None = None, *, task_level: TaskLevel = "layer") -> None:
        overlap, sharing = RUNTIME_FLAGS["flexflow"]
        super().__init__(flexflow_pricer(pricer or Pricer(sim_calibration())), overlap=overlap, sharing=sharing,
                         task_level=task_level)

    def run(self, job: Job, graph: OpGraph, plan: LoweredPlan | None = None) -> SimRun:
        plan = plan or default_plan(graph, job.parallel)
        if plan.max_in_flight:
            plan = dataclasses.replace(plan, max_in_flight=0)
        return super().run(job, graph, plan)
