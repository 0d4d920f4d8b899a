"""The census of zero optimizer states (profile/state_census.py): a tiny DLRM's untouched table rows, counted."""

import pytest

from conftest import tiny_job
from trainsim.errors import ConfigError
from trainsim.profile.executor_overhead import NEGLIGIBLE_MODELS
from trainsim.profile.state_census import census_job, count_zero_states

DLRM = NEGLIGIBLE_MODELS["dlrm"]  # 2 tables of 8 rows x 2, bottom MLP 2 -> 2 -> 2, top 2 -> 1


def test_the_census_counts_the_table_rows_no_sample_draws() -> None:
    """2 ranks x micro-batch 2: 4 samples per step, one lookup per table each. A row no sample draws keeps a zero
    state (2 entries), every step alike (the same samples each step): the census of the tables' layer holds at
    least the undrawn rows x 2 (a drawn row's entry stays zero too where every path back to it is a dead ReLU),
    a whole number of entries, and every layer's parameters as the op graph counts them."""
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.strategy.device_slice import DeviceSlice

    pytest.importorskip("torch")
    from trainsim.measure.split_model import make_data

    job = tiny_job(2, DLRM, micro_batch=2, seq_len=1)
    census = count_zero_states(job, steps=3, warmup=1)
    ids = make_data(census_job(job), 0)["ids"]  # the one micro-batch the runs and the census train on
    undrawn = sum(8 - len(set(ids[:, table].tolist())) for table in range(2))
    assert (census.model, census.samples, census.steps) == ("executor-probe-dlrm", 4, 3)
    params, zeros = census.layers[0]
    assert params == 32.0 and undrawn * 2 <= zeros <= 32.0 and zeros == int(zeros)
    graph = build_graph(census_job(job).model, DeviceSlice.of(census_job(job).parallel))
    assert {index: entry[0] for index, entry in census.layers.items()} == {
        index: layer.param_count for index, layer in enumerate(graph.layers) if layer.param_count > 0}
    assert census_job(job).parallel.micro_batch == 4 and census_job(job).parallel.dp == 1


@pytest.mark.parametrize(("steps", "warmup"), [(1, 1), (0, 0), (3, -1)])
def test_a_census_needs_a_timed_step(steps: int, warmup: int) -> None:
    with pytest.raises(ConfigError, match="steps"):
        count_zero_states(tiny_job(2, DLRM, micro_batch=2, seq_len=1), steps=steps, warmup=warmup)
