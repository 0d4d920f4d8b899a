"""predict(costs="profiled") says how much of the op time the profile measured, warns when most is not, and a
profile of micro-batch 1 does not make micro-batch 2 faster (the unmeasured shapes are scaled from the measured
ones, not priced at the roofline). No torch: the database is filled by hand."""

from pathlib import Path

import pytest

from conftest import PROFILE_ENV, TINY_GPT
from trainsim import api
from trainsim.catalog.model_files import parse_model
from trainsim.profile.database import ProfileDB
from trainsim.profile.job import job_graph
from trainsim.profile.ops import unique_signatures
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for

SEQ = 16


def _profile_micro_batch_1(path: Path) -> int:
    """Every op signature of the tiny GPT at micro-batch 1, 1 ms each; returns the ops of one micro-batch."""
    graph = job_graph(parse_model(TINY_GPT), DeviceSlice(1, SEQ, policy_for("fp32")))
    signatures, _ = unique_signatures(graph)
    with ProfileDB.open(path) as db:
        for sig in signatures:
            db.add_op_samples(PROFILE_ENV, sig, [1e-3])
    return graph.num_ops


def _predict(path: Path, micro_batch: int) -> api.Prediction:
    return api.predict(parse_model(TINY_GPT), "local-cpu", costs="profiled", db=path, precision="fp32",
                       seq_len=SEQ, micro_batch=micro_batch, global_batch=micro_batch)


def test_the_profiled_shapes_are_all_measured(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    ops = _profile_micro_batch_1(path)
    notes = _predict(path, 1).notes
    assert f"profiled costs: {ops} of {ops} ops measured (100% of the op time; exact {ops}, interpolated 0), " \
           "0 scaled from another measured size of their kernel (0%), 0 on the roofline (0%)" in notes
    assert not any(note.startswith("warning") for note in notes)


def test_micro_batch_2_off_a_micro_batch_1_profile_is_slower_and_warned(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    _profile_micro_batch_1(path)
    one, two = _predict(path, 1), _predict(path, 2)
    assert two.breakdown["compute"] > one.breakdown["compute"]
    assert two.iteration_time_s > one.iteration_time_s
    warning = next(note for note in two.notes if note.startswith("warning"))
    assert "of the op time is not measured" in warning
    assert f"--micro-batch 2 --seq-len {SEQ}" in warning and f"--db {path}" in warning


def test_roofline_costs_carry_no_profile_note() -> None:
    prediction = api.predict(parse_model(TINY_GPT), "local-cpu", precision="fp32", seq_len=SEQ, micro_batch=1,
                             global_batch=1)
    assert not any(note.startswith("profiled costs") for note in prediction.notes)


@pytest.mark.parametrize("micro_batch", [2, 4])
def test_scaled_compute_is_linear_in_the_micro_batch_where_no_size_is_interpolated(tmp_path: Path,
                                                                                    micro_batch: int) -> None:
    """Each kernel measured at one size only (1 ms): every op of micro-batch m is scaled by its size ratio, m
    for ops whose size grows with the tokens."""
    path = tmp_path / "p.sqlite"
    _profile_micro_batch_1(path)
    one = _predict(path, 1).breakdown["compute"]
    bigger = _predict(path, micro_batch).breakdown["compute"]
    assert one < bigger <= micro_batch * one * (1 + 1e-9)
