"""gamma measured the paper's way (profile.overlap, `trainsim profile --overlap`), stored per device and model
family (catalog.overlap) and used by the simulator."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import a100_cluster
from trainsim.catalog import load_model
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.overlap import load_overlap_factors, model_family, store_overlap_factor
from trainsim.cli.main import app
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.simulation import SimEstimator
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec

TINY_YAML = "name: tiny\nnum_layers: 1\nhidden: 64\nffn_hidden: 256\nnum_heads: 4\nvocab: 256\nmax_seq_len: 32\n"


def _entry(device: str, family: str, gamma: float) -> dict[str, object]:
    return {"device": device, "family": family, "gamma": gamma}


def test_store_replaces_the_entry_of_the_same_device_and_family(tmp_path: Path) -> None:
    path = tmp_path / "overlap.yaml"
    store_overlap_factor(_entry("cpu-local", "gpt", 0.2), path)
    store_overlap_factor(_entry("cpu-local", "cnn", 0.1), path)
    store_overlap_factor(_entry("cpu-local", "gpt", 0.3), path)
    assert load_overlap_factors(path) == {("cpu-local", "cnn"): 0.1, ("cpu-local", "gpt"): 0.3}


def test_a_bad_gamma_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "overlap.yaml"
    path.write_text("- {device: cpu-local, family: gpt, gamma: -1}\n")
    with pytest.raises(ConfigError) as exc:
        load_overlap_factors(path)
    assert exc.value.field == "overlap.yaml[0].gamma"


def test_the_simulator_uses_the_stored_gamma_of_the_jobs_device_and_family() -> None:
    model = load_model("gpt3-125m")
    par = ParallelSpec.parse({"micro_batch": 1, "seq_len": 1024, "dp": 8})
    job = make_job(model, a100_cluster(8), par)
    assert model_family(model) == "gpt" and model_family(load_model("resnet50")) == "cnn"
    pricer = Pricer(Calibration())
    stored = SimEstimator(pricer, overlap_factors={("a100-sxm4-80gb", "gpt"): 0.5})
    other = SimEstimator(pricer, overlap_factors={("a100-sxm4-80gb", "cnn"): 0.5})
    assert stored.options_for(job).overlap_slowdown == 0.5
    assert other.options_for(job).overlap_slowdown == Calibration().runtime.overlap_slowdown
    graph = graph_for(job)
    assert stored.estimate(job, graph).iteration_time_s > other.estimate(job, graph).iteration_time_s
    off = SimEstimator(pricer, overlap=False, overlap_factors={("a100-sxm4-80gb", "gpt"): 0.5})
    assert off.options_for(job).overlap_slowdown == 0.0


def test_profile_overlap_measures_and_stores_gamma(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model, store = tmp_path / "tiny.yaml", tmp_path / "overlap.yaml"
    model.write_text(TINY_YAML)
    result = CliRunner().invoke(app, ["profile", "--overlap", "--model", str(model), "--micro-batch", "2",
                                      "--seq-len", "16", "--repeats", "3", "--warmup", "1",
                                      "--overlap-file", str(store), "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)
    assert (entry["device"], entry["family"], entry["backend"]) == ("cpu-local", "gpt", "gloo")
    assert entry["plain_backward_s"] > 0 and entry["overlapped_backward_s"] > 0
    ratio = entry["overlapped_backward_s"] / entry["plain_backward_s"]
    # the file keeps times to the microsecond and gamma to 4 decimals
    assert entry["gamma"] == pytest.approx(max(0.0, ratio - 1.0), rel=2e-3, abs=1e-3)
    assert load_overlap_factors(store) == {("cpu-local", "gpt"): entry["gamma"]}
