"""The simulator's baselines as engines (estimate/baselines.py): "sim-plain" (Proteus Fig. 9's Plain: no runtime
behaviours) and "flexflow-sim" (Table IV's FlexFlow-Sim: collectives inserted and priced from bandwidth alone, no
overlap slow-down, no bandwidth sharing, no in-flight limit). Each returns the simulator's Result under its name;
each equals the simulator where nothing it leaves out happens, and is never slower where it does."""

import dataclasses

import pytest

from conftest import a100_cluster, local_cluster
from trainsim.catalog import load_model
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.overlap import model_family
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.baselines import FlexFlowSimEstimator, PlainSimEstimator
from trainsim.estimate.engines import ENGINES, make_engine, shape_engines
from trainsim.estimate.result import Result
from trainsim.estimate.simulation import SimEstimator
from trainsim.hardware.cluster import ClusterSpec
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for, predict
from trainsim.sim.baselines import BandwidthOnlyComm, flexflow_pricer
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec

GPT = load_model("gpt3-125m")
PRICER = Pricer(Calibration())


def _job(cluster: ClusterSpec, **strategy: object) -> Job:
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 512, "global_batch": 64, **strategy})
    return make_job(GPT, cluster, par)


def _gamma(job: Job, gamma: float) -> dict[tuple[str, str], float]:
    return {(job.cluster.device.name, model_family(job.model)): gamma}


@pytest.mark.parametrize("engine", ["sim-plain", "flexflow-sim"])
def test_the_baselines_are_engines_of_the_registry_returning_the_simulators_result(engine: str) -> None:
    job = _job(a100_cluster(8), tp=2, pp=2, dp=2)
    result = make_engine(engine).estimate(job, graph_for(job))
    assert isinstance(result, Result) and result.engine == engine and result.timeline is not None
    assert result == predict(job, engine)
    assert sum(result.breakdown.values()) == pytest.approx(result.iteration_time_s)
    entry = ENGINES.get(engine)
    assert entry.takes_plan and entry.timeline and entry.baseline
    assert engine not in shape_engines()  # "every engine" (validate --engine all, Table V) leaves them out


def test_flexflow_prices_collectives_from_bandwidth_alone() -> None:
    pricer = flexflow_pricer(PRICER)
    assert isinstance(pricer.comm_costs, BandwidthOnlyComm)
    assert pricer.op_costs is PRICER.op_costs and pricer.step_costs is PRICER.step_costs
    job = _job(a100_cluster(16), dp=16)
    link = job.cluster.inter_node
    assert link is not None
    layout = job.cluster.group_layout(16, 1)
    assert pricer.collective_s("all-reduce", 2**30, layout, job) == pytest.approx(2 * 15 / 16 * 2**30
                                                                                  / link.bw_bytes_per_s)


def test_the_baselines_equal_the_simulator_where_nothing_they_leave_out_happens() -> None:
    """Two gloo ranks of one node (collectives never overlap compute, one group: no shared link), a stored
    gamma of 0.3: the plain simulator is the simulator, FlexFlow-Sim the simulator with its collective prices;
    and on one GPU (no collective at all) all three are the same."""
    serial = _job(local_cluster(2), dp=2, global_batch=8, seq_len=128)
    graph = graph_for(serial)
    assert not serial.cluster.device.comm_overlaps_compute
    gamma = _gamma(serial, 0.3)
    sim = SimEstimator(PRICER, overlap_factors=gamma).estimate(serial, graph).iteration_time_s
    assert PlainSimEstimator(PRICER).estimate(serial, graph).iteration_time_s == sim
    with_bandwidth = SimEstimator(flexflow_pricer(PRICER), overlap_factors=gamma).estimate(serial, graph)
    assert FlexFlowSimEstimator(PRICER).estimate(serial, graph).iteration_time_s == with_bandwidth.iteration_time_s
    one = _job(a100_cluster(1), global_batch=4)
    graph = graph_for(one)
    engines = (SimEstimator(PRICER, overlap_factors=_gamma(one, 0.3)), PlainSimEstimator(PRICER),
               FlexFlowSimEstimator(PRICER))
    times = {engine.estimate(one, graph).iteration_time_s for engine in engines}
    assert len(times) == 1


def test_the_baselines_are_faster_where_overlap_and_link_sharing_happen() -> None:
    """pp 2 x dp 16 on nodes of one NIC: the gradient buckets overlap the backward pass (gamma 0.3) and share
    the NIC with the pipeline's sends. Each behaviour alone slows the simulator; the baselines leave both out."""
    cluster = a100_cluster(32).model_copy(update={"nics_per_node": 1})
    job = _job(cluster, dp=16, pp=2)
    graph = graph_for(job)
    gamma = _gamma(job, 0.3)
    bandwidth = flexflow_pricer(PRICER)
    both = SimEstimator(bandwidth, overlap_factors=gamma).estimate(job, graph).iteration_time_s
    overlap_only = SimEstimator(bandwidth, overlap_factors=gamma, sharing=False).estimate(job, graph).iteration_time_s
    sharing_only = SimEstimator(bandwidth, overlap=False).estimate(job, graph).iteration_time_s
    flexflow = FlexFlowSimEstimator(PRICER).estimate(job, graph).iteration_time_s
    assert flexflow < overlap_only < both and flexflow < sharing_only < both
    proteus = SimEstimator(PRICER, overlap_factors=gamma).estimate(job, graph).iteration_time_s
    assert PlainSimEstimator(PRICER).estimate(job, graph).iteration_time_s < proteus


def test_flexflow_drops_the_in_flight_limit() -> None:
    """GPipe over 2 stages with 8 micro-batches: a limit of 1 in flight serialises each forward with its
    backward, which the plain simulator honours and FlexFlow-Sim does not."""
    job = _job(a100_cluster(2), pp=2, schedule="gpipe", global_batch=8)
    graph = graph_for(job)
    plan = default_plan(graph, job.parallel)
    limited = dataclasses.replace(plan, max_in_flight=1)
    free = FlexFlowSimEstimator(PRICER).estimate(job, graph, plan).iteration_time_s
    assert FlexFlowSimEstimator(PRICER).estimate(job, graph, limited).iteration_time_s == free
    honoured = SimEstimator(flexflow_pricer(PRICER), overlap=False, sharing=False).estimate(job, graph, limited)
    assert honoured.iteration_time_s > free
    assert PlainSimEstimator(PRICER).estimate(job, graph, limited).iteration_time_s > \
        PlainSimEstimator(PRICER).estimate(job, graph, plan).iteration_time_s


def test_a_tree_needs_an_engine_that_takes_a_plan() -> None:
    from trainsim.api.prediction import predict as api_predict

    with pytest.raises(ConfigError, match="needs an engine that reads it: analytical, flexflow-sim, sim, sim-plain"):
        api_predict(model="gpt3-125m", num_gpus=2, global_batch=4, seq_len=128, engine="precision-aware",
                    tree="any.yaml")
