"""Coverage of `trainsim validate` on rows shaped like published multi-node runs: every such row is predicted with
finite positive figures or refused in one line naming the field; the refusals a plausible row may meet are the
ones no stated fact resolves (a GPU the catalog lacks, a GPU count that is no whole number of the servers)."""

import math
from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from published_rows import published_rows, rule_breaking_rows

from trainsim.errors import MAX_MESSAGE_CHARS
from trainsim.estimate.engines import Estimator, make_engine
from trainsim.pipeline import GraphCache
from trainsim.strategy.stages import virtual_stage_blocks
from trainsim.validate.predict_runs import RowPrediction, predict_rows
from trainsim.validate.runs import RunRow, job_from_row

# what a plausible row may still be refused for: a GPU no catalog entry or note names (a TPU), and a GPU count
# that is no whole number of the named machine's servers (8,192 GPUs on Summit's 6-GPU nodes)
ALLOWED_REFUSALS = ("gpu 'other' is not in the catalog", "num_gpus=")


@cache
def _engine(name: str) -> Estimator:
    return make_engine(name, "roofline", None)


def _predict(fields: dict[str, str], engine: str = "analytical") -> RowPrediction:
    row = RunRow(fields["run_id"], fields["source"], fields["metric"], float(fields["value"]), fields)
    [prediction] = predict_rows([row], _engine(engine), graphs=GraphCache())
    return prediction


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(published_rows())
def test_a_published_row_is_predicted_or_refused_for_a_reason_no_fact_resolves(fields: dict[str, str]) -> None:
    prediction = _predict(fields)
    if prediction.skipped is not None:
        assert prediction.skipped.startswith(ALLOWED_REFUSALS), prediction.skipped
        assert "\n" not in prediction.skipped and len(prediction.skipped) <= MAX_MESSAGE_CHARS
        return
    assert prediction.predicted is not None and math.isfinite(prediction.predicted) and prediction.predicted > 0


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_breaking_rows())
def test_a_row_that_breaks_a_rule_is_refused_in_one_line_naming_the_field(case: tuple[dict[str, str], str]) -> None:
    fields, field = case
    prediction = _predict(fields)
    assert prediction.predicted is None and prediction.skipped is not None
    assert "\n" not in prediction.skipped and len(prediction.skipped) <= MAX_MESSAGE_CHARS
    assert prediction.skipped.startswith(field) or prediction.skipped.startswith(ALLOWED_REFUSALS), (
        field, prediction.skipped)


def _row(**cells: str) -> dict[str, str]:
    row = {"run_id": "r", "source": "somewhere/paper Table 1", "arch": "gpt", "num_layers": "8", "hidden": "512",
           "num_heads": "8", "seq_len": "2048", "gpu": "h100-sxm5-80gb", "num_gpus": "16", "tp": "1", "pp": "4",
           "dp": "4", "micro_batch": "1", "global_batch": "", "metric": "iteration_time_s", "value": "1"}
    return {**row, **cells}


def test_an_interleaved_pipeline_runs_whole_groups_of_pp_micro_batches() -> None:
    def global_batch(**cells: str) -> int:
        run = job_from_row(_row(**cells))
        assert run.job is not None, run.skipped
        return run.job.parallel.global_batch

    # Megatron-LM's interleaved schedule runs a multiple of pp micro-batches per replica (pp 4, dp 4)
    assert global_batch(vpp="2", global_batch="64") == 64  # 16 micro-batches: 4 groups, as stated
    assert global_batch(vpp="2", global_batch="44") == 48  # 11 micro-batches: the nearest whole groups, 3 x 4
    assert global_batch(vpp="2", global_batch="36") == 32  # 9: 2 x 4
    assert global_batch(vpp="2", global_batch="") == 16  # not stated: one group, 4 micro-batches of dp 4
    assert global_batch(vpp="2", global_batch="4") == 16  # fewer than a group: one group
    # 1F1B: any count; an empty global batch is Megatron's default, one micro-batch per replica
    assert global_batch(vpp="1", global_batch="44") == 44
    assert global_batch(vpp="1", global_batch="") == 4


def test_a_gpus_per_node_cell_that_states_an_nvl72_rack_keeps_the_trays() -> None:
    rack = job_from_row(_row(gpu="gb200", num_gpus="256", dp="64", gpus_per_node="72"))
    unstated = job_from_row(_row(gpu="gb200", num_gpus="256", dp="64"))
    assert rack.job is not None and unstated.job is not None, (rack.skipped, unstated.skipped)
    cluster = rack.job.cluster
    # 64 trays of 4 over the fewest racks that hold them, evenly: 4 racks of 64 GPUs (16 of the 18 trays)
    assert (cluster.gpus_per_node, cluster.num_nodes, cluster.domain_capacity_gpus) == (4, 64, 72)
    assert (cluster.num_domains, cluster.gpus_per_domain) == (4, 64)
    assert cluster == unstated.job.cluster
    # other servers keep the stated count: 4-GPU servers of a DGX H100's network
    four = job_from_row(_row(num_gpus="256", dp="64", gpus_per_node="4"))
    assert four.job is not None and four.job.cluster.gpus_per_node == 4


def test_one_or_two_virtual_stages_more_than_layers_count_the_embedding_and_the_loss() -> None:
    def split(layers: int, pp: int, vpp: int) -> tuple[bool, bool, tuple[int, ...]]:
        run = job_from_row(_row(num_layers=str(layers), pp=str(pp), dp=str(16 // pp), vpp=str(vpp),
                                global_batch="64"))
        assert run.job is not None, run.skipped
        parallel = run.job.parallel
        return parallel.embedding_in_split, parallel.loss_in_split, virtual_stage_blocks(layers, parallel)

    # 6 layers on 8 virtual stages: embedding alone on the first, loss alone on the last (pp 4 x vpp 2)
    assert split(6, 4, 2) == (True, True, (0, 1, 1, 1, 1, 1, 1, 0))
    # 7 layers: 9 counted over 8 stages, the first holds two of them (the embedding and a block)
    assert split(7, 4, 2) == (True, True, (1, 1, 1, 1, 1, 1, 1, 0))
    # as many layers as stages, or more: the plain split
    assert split(8, 4, 2) == (False, False, (1,) * 8)
    assert split(9, 4, 2) == (False, False, (2, 1, 1, 1, 1, 1, 1, 1))
    # three stages more than layers: refused, naming pp
    run = job_from_row(_row(num_layers="5", pp="4", dp="4", vpp="2", global_batch="64"))
    assert run.job is None and run.skipped is not None and run.skipped.startswith("pp=4 is invalid")


def test_a_simulation_past_its_bound_refuses_that_run_and_the_others_are_predicted() -> None:
    huge = _row(run_id="huge", pp="1", dp="16", global_batch=str(16 * 20_000))  # 20,000 micro-batches x 8 layers
    small = _row(run_id="small", pp="1", dp="16", global_batch="16")
    rows = [RunRow(f["run_id"], f["source"], f["metric"], 1.0, f) for f in (huge, small)]
    refused, predicted = predict_rows(rows, _engine("sim"), graphs=GraphCache())
    assert refused.predicted is None and refused.skipped is not None
    assert refused.skipped.startswith("engine='sim' is invalid: the simulation would run")
    assert predicted.skipped is None and predicted.predicted is not None and predicted.predicted > 0


def test_an_empty_dp_is_the_gpus_over_the_other_degrees_and_a_stated_sp_is_0_or_1() -> None:
    run = job_from_row(_row(num_gpus="64", tp="2", pp="4", cp="2", dp="", global_batch="64"))
    assert run.job is not None and run.job.parallel.dp == 4  # 64 / (2 x 4 x 2)
    run = job_from_row(_row(num_gpus="24", tp="2", pp="8", dp=""))
    assert run.skipped == "tp*pp*cp=16 is invalid: must divide the number of GPUs (24); tp=2 pp=8 cp=1"
    run = job_from_row(_row(tp="2", pp="2", sp="2"))
    assert run.skipped == "sp=2 is invalid: must be 0 (off) or 1 (on), or empty"


def test_a_sequence_length_that_is_not_positive_is_refused_naming_the_column() -> None:
    for seq in ("0", "-2048"):
        run = job_from_row(_row(seq_len=seq))
        assert run.job is None and run.skipped == f"seq_len={seq.lstrip('+')} is invalid: must be a positive " \
                                                  "number of tokens"


@settings(max_examples=10, deadline=None, database=None)
@given(st.sampled_from([(2, 8), (4, 4), (8, 2)]), st.integers(1, 40))
def test_interleaved_rounding_lands_on_a_multiple_of_the_pipeline(pp_dp: tuple[int, int], stated: int) -> None:
    pp, dp = pp_dp
    run = job_from_row(_row(pp=str(pp), dp=str(dp), vpp="2", num_layers="16", global_batch=str(stated)))
    assert run.job is not None, run.skipped
    parallel = run.job.parallel
    assert parallel.num_micro_batches % pp == 0 and parallel.num_micro_batches >= pp
