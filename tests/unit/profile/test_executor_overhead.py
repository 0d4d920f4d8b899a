"""The split executor's cost per op (profile/executor_overhead.py): the arithmetic, the probes, bad input. The
run itself (ranks through `trainsim measure`) is exercised by scripts/proteus_table4.py --executor-overhead."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import PROFILE_ENV
from trainsim.catalog.model_files import parse_model
from trainsim.cli.main import app
from trainsim.cost.profiled import ProfiledCosts
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.build import build_graph
from trainsim.profile.database import ProfileDB
from trainsim.profile.executor_overhead import (
    FAMILIES,
    NEGLIGIBLE_MODELS,
    ExecutorOverhead,
    executor_signature,
    measure_executor_overhead,
    per_op_of,
    store_executor_overhead,
)
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.precision import policy_for


def test_per_op_is_the_phase_less_its_kernels_over_its_ops_less_autograd() -> None:
    """10 ms of forward over 2 steps = 5 ms a micro-batch, less 1 ms of kernels, over 40 ops = 100 us, less
    10 us of autograd = 90 us; a backward below its kernels is 0, not negative."""
    phases = {"forward": 0.010, "backward": 0.002, "grad_sync": 0.5, "optimizer": 0.5}
    got = per_op_of(phases, 2, {"fwd": 40, "bwd": 50}, {"fwd": 1e-3, "bwd": 2e-3}, 1e-5)
    assert got["fwd"] == pytest.approx(9e-5)
    assert got["bwd"] == 0.0


def test_steps_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="steps"):
        per_op_of({"forward": 1.0, "backward": 1.0}, 0, {"fwd": 1, "bwd": 1}, {"fwd": 0.0, "bwd": 0.0}, 0.0)


@pytest.mark.parametrize(("family", "fwd_ops"), [("cnn", 27), ("transformer", 15), ("dlrm", 12)])
def test_every_family_has_a_negligible_probe(family: str, fwd_ops: int) -> None:
    """Each probe parses as its family's model and has under 10,000 parameters (its kernels are a few us)."""
    spec = parse_model(NEGLIGIBLE_MODELS[family])
    assert spec.kind == family
    graph = build_graph(spec, DeviceSlice(1, 16 if family == "transformer" else 1, policy_for("fp32")))
    assert sum(layer.count * len(layer.fwd) for layer in graph.layers) == fwd_ops
    assert graph.param_count() < 10_000


def test_stored_figures_are_the_executor_signatures_median(tmp_path: Path) -> None:
    result = ExecutorOverhead("cnn", {"fwd": [7e-5, 8e-5, 9e-5], "bwd": [0.0, 1e-6, 2e-6]}, {"fwd": 27, "bwd": 35},
                              {"fwd": 2e-4, "bwd": 2e-3}, 3e-6, 3, 20)
    with ProfileDB.open(tmp_path / "p.db") as db:
        store_executor_overhead(db, PROFILE_ENV, result)
        assert db.op_repeats(PROFILE_ENV, executor_signature("cnn", "fwd")) == 3
    costs = ProfiledCosts(tmp_path / "p.db")
    assert costs.executor_per_op_s("cpu-local", "cnn", "fwd") == pytest.approx(8e-5)
    assert costs.executor_per_op_s("cpu-local", "cnn", "bwd") == pytest.approx(1e-6)
    assert costs.executor_per_op_s("cpu-local", "dlrm", "fwd") is None


@pytest.mark.parametrize(("kwargs", "field"), [({"family": "opaque"}, "family"),
                                               ({"family": "cnn", "world_size": 1}, "world_size"),
                                               ({"family": "cnn", "iterations": 0}, "iterations")])
def test_bad_input_is_refused_before_any_rank_starts(kwargs: dict[str, object], field: str) -> None:
    assert set(FAMILIES) == set(NEGLIGIBLE_MODELS)
    with pytest.raises(ConfigError, match=field):
        measure_executor_overhead(**kwargs)  # type: ignore[arg-type]


DLRM_SMALL = Path(__file__).resolve().parents[3] / "data" / "strategies" / "proteus" / "small" / "models" / \
    "dlrm-small.yaml"


def test_profile_executor_overhead_measures_the_family_and_stores_it(tmp_path: Path) -> None:
    """End to end on 2 gloo ranks, 2 steps: the DLRM probe's figures land in the database under the device,
    and the stored medians are what the command printed."""
    pytest.importorskip("torch")
    db = tmp_path / "p.db"
    result = CliRunner().invoke(app, ["profile", "--executor-overhead", "--model", str(DLRM_SMALL), "--repeats",
                                      "2", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)
    assert (entry["device"], entry["family"], entry["iterations"], entry["ops"]) == (
        "cpu-local", "dlrm", 2, {"fwd": 12, "bwd": 16})
    costs = ProfiledCosts(db)
    for phase in ("fwd", "bwd"):
        ranks = sorted(entry["per_op_s"][phase])
        assert costs.executor_per_op_s("cpu-local", "dlrm", phase) == pytest.approx((ranks[0] + ranks[1]) / 2)
    assert min(entry["per_op_s"]["fwd"]) > 0.0  # the executor's Python per forward op costs CPU time


def test_profile_executor_overhead_refuses_a_bad_timeout(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["profile", "--executor-overhead", "--model", str(DLRM_SMALL),
                                      "--timeout-s", "0", "--db", str(tmp_path / "p.db")])
    assert result.exit_code == 2 and "timeout_s" in result.output
