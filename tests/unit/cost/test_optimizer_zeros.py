"""The zero-state share of embedding tables (cost/optimizer_zeros.py) and its price (cost/profiled.py)."""

import math
from pathlib import Path

import pytest

from conftest import PROFILE_ENV, local_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.cost.optimizer_zeros import untouched_row_share, zero_state_share
from trainsim.cost.pricing import Pricer
from trainsim.cost.profiled import ProfiledCosts
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.dlrm import build_dlrm
from trainsim.ir.model_spec import DlrmSpec, EmbeddingTable
from trainsim.job import make_job
from trainsim.profile.database import ProfileDB
from trainsim.profile.ops import has_sparse_tables, optimizer_signature, zero_state_optimizer_signature
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec

TINY = DlrmSpec(name="tiny", dense_features=2, bottom_mlp=(2,), top_mlp=(1,),
                tables=(EmbeddingTable(rows=4, dim=2), EmbeddingTable(rows=8, dim=2, count=2)))


def test_a_tiny_tables_untouched_rows_by_hand() -> None:
    assert untouched_row_share(4, 2) == pytest.approx((3 / 4) ** 2)  # 9 of 16 pairs of draws miss a given row
    assert untouched_row_share(4, 0) == 1.0
    assert untouched_row_share(1, 1) == 0.0
    # zipf 1 over 2 rows: p = (2/3, 1/3); one draw misses row 0 w.p. 1/3 and row 1 w.p. 2/3: mean 1/2
    assert untouched_row_share(2, 1, zipf_alpha=1.0) == pytest.approx(0.5)
    assert untouched_row_share(2, 2, zipf_alpha=1.0) == pytest.approx((1 / 9 + 4 / 9) / 2)


def test_the_zero_share_weighs_each_table_by_its_parameters() -> None:
    par = ParallelSpec(dp=2, micro_batch=1, global_batch=2)  # 2 lookups per table per step
    zero = 4 * 2 * (3 / 4) ** 2 + 2 * 8 * 2 * (7 / 8) ** 2
    assert zero_state_share(TINY, par) == pytest.approx(zero / (8 + 32))
    more = ParallelSpec(dp=2, micro_batch=2, global_batch=8)  # 2 micro-batches of 4 samples: 8 lookups
    assert zero_state_share(TINY, more) == pytest.approx((8 * (3 / 4) ** 8 + 32 * (7 / 8) ** 8) / 40)


@pytest.mark.parametrize(("rows", "lookups", "alpha"), [(0, 1.0, 0.0), (4, -1.0, 0.0), (4, math.nan, 0.0),
                                                        (4, 1.0, -1.0)])
def test_bad_tables_are_refused(rows: int, lookups: float, alpha: float) -> None:
    with pytest.raises(ConfigError):
        untouched_row_share(rows, lookups, alpha)


def test_only_the_split_executors_tables_hold_zero_states() -> None:
    par = ParallelSpec(dp=2, micro_batch=1, global_batch=2)
    graph = build_dlrm(TINY, DeviceSlice.of(par))
    embeddings, bottom = graph.layers[0], graph.layers[1]
    assert has_sparse_tables(graph)
    harness = make_job(TINY, local_cluster(2), par, StackSpec(split_executor=True))
    pricer = Pricer(Calibration())
    assert pricer.zero_state_params_of(embeddings, 40.0, harness) == pytest.approx(40.0 * zero_state_share(TINY, par))
    assert pricer.zero_state_params_of(bottom, 6.0, harness, 1) == 0.0  # no census: dense layers price none
    assert pricer.zero_state_params_of(embeddings, 40.0, make_job(TINY, local_cluster(2), par)) == 0.0


def test_a_census_prices_a_dense_layers_zero_states_for_the_split_executor_only(tmp_path: Path) -> None:
    """A census stored for the tiny DLRM on 2 samples per step: the bottom MLP (layer 1) keeps 3 of its 6
    parameters' states at zero; a device holding 4 of them is priced 4 x 3/6 = 2 zero states; another sample
    count, a layer not counted, or a job without the split executor: none."""
    from trainsim.cost.profiled import ProfiledStepCosts
    from trainsim.cost.step import FittedStepCosts
    from trainsim.profile.database import StateCensus

    par = ParallelSpec(dp=2, micro_batch=1, global_batch=2)
    bottom = build_dlrm(TINY, DeviceSlice.of(par)).layers[1]
    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, optimizer_signature(1000), [0.010])
        db.put_state_census(StateCensus("tiny", 2, 7, {1: (6.0, 3.0)}, "by hand"))
    costs = ProfiledCosts(path, PROFILE_ENV.device)
    pricer = Pricer(Calibration(), op_costs=costs, step_costs=ProfiledStepCosts(costs, FittedStepCosts(Calibration())))
    harness = make_job(TINY, local_cluster(2), par, StackSpec(split_executor=True))
    assert pricer.zero_state_params_of(bottom, 4.0, harness, 1) == 2.0
    assert pricer.zero_state_params_of(bottom, 4.0, harness, 3) == 0.0
    assert pricer.zero_state_params_of(bottom, 4.0, make_job(TINY, local_cluster(2), par), 1) == 0.0
    four = ParallelSpec(dp=2, micro_batch=2, global_batch=4)
    assert pricer.zero_state_params_of(bottom, 4.0, make_job(TINY, local_cluster(2), four, harness.stack), 1) == 0.0


def test_a_stored_census_reads_back_and_replaces_its_predecessor(tmp_path: Path) -> None:
    from trainsim.profile.database import StateCensus

    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        db.put_state_census(StateCensus("m", 8, 7, {0: (10.0, 1.0), 3: (30.0, 3.0)}))
        db.put_state_census(StateCensus("m", 8, 7, {0: (10.0, 5.0)}, "again"))
        db.put_state_census(StateCensus("m", 16, 7, {0: (10.0, 2.0)}))
    with ProfileDB.open_read_only(path) as db:
        stored = {(c.model, c.samples): c for c in db.state_census_rows()}
    assert stored[("m", 8)].layers == {0: (10.0, 5.0)} and stored[("m", 8)].detail == "again"
    assert stored[("m", 16)].zero_state_share == 0.2


def test_the_optimizer_price_mixes_the_two_measured_steps(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, optimizer_signature(1000), [0.010])
    costs = ProfiledCosts(path, PROFILE_ENV.device)
    assert costs.optimizer_step_s(1000, PROFILE_ENV.device) == pytest.approx(0.010)
    assert costs.optimizer_step_s(1000, PROFILE_ENV.device, 250) == pytest.approx(0.010)  # no zero step measured
    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, zero_state_optimizer_signature(1000), [0.030])
    costs = ProfiledCosts(path, PROFILE_ENV.device)
    assert costs.optimizer_step_s(1000, PROFILE_ENV.device) == pytest.approx(0.010)
    assert costs.optimizer_step_s(1000, PROFILE_ENV.device, 250) == pytest.approx(0.75 * 0.010 + 0.25 * 0.030)
    assert costs.optimizer_step_s(1000, PROFILE_ENV.device, 1000) == pytest.approx(0.030)


def test_a_zero_state_costs_the_probes_surcharge_per_parameter_whatever_the_models_step(tmp_path: Path) -> None:
    """The random step measured at 500 and 1000 parameters (8 and 10 ms: a model of many tensors steps dearer
    per parameter), the zero step at 1000 only (30 ms): 20 us more per zero state. 500 parameters of which 100
    zero: 8 ms + 100 x 20 us = 10 ms; 2000 parameters are outside the random step's range: unmeasured."""
    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, optimizer_signature(500), [0.008])
        db.add_op_samples(PROFILE_ENV, optimizer_signature(1000), [0.010])
        db.add_op_samples(PROFILE_ENV, zero_state_optimizer_signature(1000), [0.030])
    costs = ProfiledCosts(path, PROFILE_ENV.device)
    assert costs.optimizer_step_s(500, PROFILE_ENV.device, 100) == pytest.approx(0.008 + 100 * 0.020 / 1000)
    assert costs.optimizer_step_s(500, PROFILE_ENV.device, 900) == pytest.approx(0.008 + 500 * 0.020 / 1000)
    assert costs.optimizer_step_s(2000, PROFILE_ENV.device, 100) is None


def test_the_compiled_optimizer_step_pays_for_the_untouched_rows(tmp_path: Path) -> None:
    """A tiny DLRM on 2 ranks through the split executor: the optimizer task is the measured steps mixed by the
    device's zero-state parameters (tables x untouched share); without the split executor, the random step."""
    from trainsim.compile.build import compile_job
    from trainsim.cost.profiled import ProfiledStepCosts
    from trainsim.cost.step import FittedStepCosts
    from trainsim.pipeline import graph_for
    from trainsim.strategy.lowered import default_plan

    par = ParallelSpec(dp=2, micro_batch=1, global_batch=2)
    job = make_job(TINY, local_cluster(2), par, StackSpec(split_executor=True))
    params = round(graph_for(job).param_count())
    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, optimizer_signature(params), [0.010])
        db.add_op_samples(PROFILE_ENV, zero_state_optimizer_signature(params), [0.030])
    costs = ProfiledCosts(path, PROFILE_ENV.device)
    pricer = Pricer(Calibration(), op_costs=costs, step_costs=ProfiledStepCosts(costs, FittedStepCosts(Calibration())))
    share = 40 * zero_state_share(TINY, par) / params
    for stack, expected in ((job.stack, (1 - share) * 0.010 + share * 0.030), (StackSpec(), 0.010)):
        run = make_job(TINY, local_cluster(2), par, stack)
        graph = compile_job(run, default_plan(graph_for(run), run.parallel), pricer)
        step = next(t for t in graph.tasks if t.name == "optimizer step")
        assert step.duration_s == pytest.approx(expected)


def test_zipf_rows_priced_in_chunks_give_the_same_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsim.cost import optimizer_zeros

    whole = optimizer_zeros.untouched_row_share(100, 50, 1.2)
    monkeypatch.setattr(optimizer_zeros, "_CHUNK_ROWS", 7)  # 15 chunks, the last one short
    assert optimizer_zeros.untouched_row_share(100, 50, 1.2) == pytest.approx(whole, rel=1e-12)
