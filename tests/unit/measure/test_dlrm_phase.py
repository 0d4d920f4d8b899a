"""A measured DLRM iteration normalised to the host's fast phase (measure.dlrm_phase): the slowest rank's probe
as an iteration's reference, the normalisation on an exact tiny case, the probe timings carried from the ranks'
records into the run file, and a real 2-rank run with both probes on."""

import math
from typing import Any

import pytest

from conftest import three_table_dlrm_job
from trainsim.errors import ConfigError
from trainsim.measure import dlrm
from trainsim.measure.dlrm_phase import (
    PROBES,
    campaign_fast_reference_s,
    check_probes,
    iteration_references_s,
    normalised_iterations_s,
    phase_normalised_iteration_s,
)


def test_an_iterations_reference_is_the_slowest_ranks_mean_probe() -> None:
    rank_probes = [[(1.0, 3.0), (2.0, 2.0)],  # rank 0: means 2.0, 2.0
                   [(1.5, 1.5), (4.0, 2.0)]]  # rank 1: means 1.5, 3.0
    assert iteration_references_s(rank_probes) == [2.0, 3.0]
    with pytest.raises(ValueError, match="one pair per iteration"):
        iteration_references_s([[(1.0, 1.0)], []])


def test_iterations_are_scaled_to_the_fast_phase_reference_exactly() -> None:
    iterations = [0.030, 0.045, 0.040]
    references = [0.002, 0.003, 0.0025]  # the second in a phase 1.5x slower, the third 1.25x
    fast = campaign_fast_reference_s([references, [0.0021, 0.004]])  # 5% quantile of 5 values: the lowest
    assert fast == 0.002
    assert normalised_iterations_s(iterations, references, fast) == pytest.approx([0.030, 0.030, 0.032])
    assert phase_normalised_iteration_s(iterations, references, fast) == pytest.approx(0.030)
    with pytest.raises(ValueError, match="one per run"):
        normalised_iterations_s(iterations, references[:2], fast)


def test_an_unknown_probe_is_refused_with_the_choices() -> None:
    assert check_probes(("gather",)) == ("gather",)
    with pytest.raises(ConfigError, match="reference, gather"):
        check_probes(("cache",))
    with pytest.raises(ConfigError, match="probe"):
        dlrm.measure_dlrm([], probes=("cache",))


def _record(iteration_s: float, reference: tuple[float, float]) -> dict[str, Any]:
    return {"iteration_s": iteration_s, "events": [("a", 0.0, iteration_s)], "cpu_s": [iteration_s / 2],
            "faults": [0], "probe_s": {"reference": reference}}


def test_the_run_file_carries_every_probe_timing_and_the_normalised_iteration() -> None:
    by_rank = {0: {"records": [_record(1.0, (0.1, 0.1)), _record(3.0, (0.2, 0.4)), _record(2.0, (0.2, 0.2))]},
               1: {"records": [_record(2.0, (0.1, 0.3)), _record(1.0, (0.1, 0.1)), _record(1.0, (0.1, 0.1))]}}
    config: Any = None
    m = dlrm._summarize(config, by_rank, 2)
    assert m.iterations_s == (2.0, 3.0, 2.0)
    assert m.rank_iterations_s == ((1.0, 3.0, 2.0), (2.0, 1.0, 1.0))
    assert m.rank_probe_s == {"reference": (((0.1, 0.1), (0.2, 0.4), (0.2, 0.2)), ((0.1, 0.3), (0.1, 0.1),
                                                                                    (0.1, 0.1)))}
    d = dlrm.measurement_to_dict(_with_config(m))
    assert d["iteration_s"] == 2.0  # the raw median stays
    assert d["probe_s"]["reference"][1][0] == [0.1, 0.3]
    assert d["probe_reference_s"]["reference"] == pytest.approx([0.2, 0.3, 0.2])
    assert d["fast_probe_s"]["reference"] == pytest.approx(0.2)
    # normalised: 2.0, 3.0 x 0.2 / 0.3 = 2.0, 2.0
    assert d["phase_iteration_s"]["reference"] == pytest.approx(2.0)


def _with_config(m: dlrm.DlrmMeasurement) -> dlrm.DlrmMeasurement:
    from dataclasses import replace

    return replace(m, config=dlrm.DlrmConfig("tiny", three_table_dlrm_job().plan, 16, {}))


def test_a_run_without_probes_has_no_phase_fields() -> None:
    by_rank = {r: {"records": [{k: v for k, v in _record(1.0, (0.1, 0.1)).items() if k != "probe_s"}]}
               for r in (0, 1)}
    config: Any = None
    m = _with_config(dlrm._summarize(config, by_rank, 2))
    assert m.rank_probe_s == {}
    assert "probe_s" not in dlrm.measurement_to_dict(m)


def test_a_real_two_rank_dlrm_run_times_both_probes_around_every_iteration() -> None:
    sjob = three_table_dlrm_job(batch=8)
    dense = {"dense_features": 13, "bottom_mlp": [32, 16], "top_mlp": [16, 1]}
    config = dlrm.DlrmConfig("three", sjob.plan, 8, dense)
    m = dlrm.measure_dlrm([config], iterations=3, warmup=1, timeout_s=120, probes=PROBES)[0]
    d = dlrm.measurement_to_dict(m)
    assert sorted(d["probe_s"]) == sorted(PROBES)
    for probe in PROBES:
        timings = d["probe_s"][probe]
        assert [len(rank) for rank in timings] == [3, 3]  # per rank, per measured iteration
        assert all(len(pair) == 2 and all(0 < t < 1 for t in pair) for rank in timings for pair in rank)
        assert d["probe_reference_s"][probe] == pytest.approx(iteration_references_s(timings))
        normal = d["phase_iteration_s"][probe]
        # every iteration scaled by <= 1 (a scale of exactly 1 may round the last bit the other way)
        assert math.isfinite(normal) and 0 < normal <= d["iteration_s"] * (1 + 1e-12)
    assert [len(r) for r in d["rank_iterations_s"]] == [3, 3]
    assert d["iterations_s"] == [max(a, b) for a, b in zip(*d["rank_iterations_s"], strict=True)]
