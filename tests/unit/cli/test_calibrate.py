"""`trainsim calibrate --runs/--output` on a tiny runs file, the package fit never overwritten unless asked, and
`--calibration` on predict, search and validate (and the job file's `calibration:`)."""

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.catalog.calibration import FITTED_PATH, MEASUREMENTS_DIR, read_calibration
from trainsim.catalog.uncertainty import GROUPS

RUNNER = CliRunner()
PREDICT = ["predict", "--model", "gpt3-125m", "--global-batch", "16", "--json"]


def _app() -> Any:
    from trainsim.cli.main import app

    return app


def _one_error_line(result: Any, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def _tiny_runs(path: Path, per_source: int = 2) -> Path:
    """The first iteration-time runs of vTrain (2 GPUs) and llm-foundry (8 GPUs) from the shipped runs.csv."""
    with (MEASUREMENTS_DIR / "runs.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields, picked, count = reader.fieldnames, [], {}
        for row in reader:
            source = row["source"].split()[0]
            if row["metric"] == "iteration_time_s" and source in ("VIA-Research/vTrain", "mosaicml/llm-foundry") \
                    and count.get(source, 0) < per_source:
                count[source] = count.get(source, 0) + 1
                picked.append(row)
    assert fields is not None and len(picked) == 2 * per_source
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(picked)
    return path


def _calibration_file(path: Path, update: dict[str, Any]) -> Path:
    """The package fit with `update` merged in (one level deep)."""
    data = yaml.safe_load(FITTED_PATH.read_text())
    for key, value in update.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    path.write_text(yaml.safe_dump(data))
    return path


def _bands(low: float, high: float) -> dict[str, Any]:
    return {"min_gpus": 2, "max_gpus": 256, "calibrated_stacks": [],
            "bands": {group: {"low_ratio": low, "high_ratio": high, "residuals": 100} for group in GROUPS}}


@pytest.fixture(scope="module")
def tiny_fit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fit of the run-level parameters on four runs (the microbenchmark fits on the shipped data)."""
    folder = tmp_path_factory.mktemp("fit")
    before = FITTED_PATH.read_bytes()
    output = folder / "sub" / "mine.yaml"
    result = RUNNER.invoke(_app(), ["calibrate", "--runs", str(_tiny_runs(folder / "mine.csv")), "--output",
                                    str(output), "--no-sim", "--held-out", str(folder / "held.csv"), "--report",
                                    str(folder / "report.json")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"wrote {output}" in result.output
    assert "[1/" in result.stderr and "run-level fit on 4 runs" in result.stderr  # progress, one line per fit
    assert FITTED_PATH.read_bytes() == before  # the package's own fit is untouched
    return output


def test_fit_writes_its_held_out_predictions(tiny_fit: Path) -> None:
    from trainsim.calibrate.bands import read_held_out

    records = read_held_out(tiny_fit.parent.parent / "held.csv")
    # 5-fold over 4 runs (4 folds), each source held out (2 x 2 runs), scale: none (all runs on at most 8 GPUs)
    assert sorted({r.scheme for r in records}) == ["k-fold", "leave-one-source-out"]
    assert len(records) == 8 and {r.num_gpus for r in records} == {2, 8}


def test_bands_from_held_out_predictions_change_nothing_else(tmp_path: Path) -> None:
    from trainsim.calibrate.bands import HeldOut, held_out_csv, uncertainty_of
    from trainsim.calibrate.fit import default_runs_files, read_samples

    records = [HeldOut("leave-one-source-out", "x", f"{source}-{i}", source, 8, (i - 10) / 64 * sign,
                       group) for i in range(20) for source, sign in (("a", 1), ("b", -2)) for group in GROUPS]
    (tmp_path / "held.csv").write_text(held_out_csv(records))
    fit = tmp_path / "fit.yaml"
    fit.write_bytes(FITTED_PATH.read_bytes())
    result = RUNNER.invoke(_app(), ["calibrate", "--bands-from", str(tmp_path / "held.csv"), "--output", str(fit)])
    assert result.exit_code == 0, (result.output, result.exception)
    before, after = yaml.safe_load(FITTED_PATH.read_text()), yaml.safe_load(fit.read_text())
    expected = uncertainty_of(records, read_samples(default_runs_files()))
    written = read_calibration(fit).uncertainty
    assert expected is not None and written is not None
    for group in GROUPS:  # the file keeps 6 significant digits
        got, want = written.bands[group], expected.bands[group]
        assert (got.low_ratio, got.high_ratio) == pytest.approx((want.low_ratio, want.high_ratio), rel=1e-5)
        assert (got.residuals, got.basis) == (want.residuals, want.basis) == (40, "own")
    changed = {key for key in {*before, *after} if before.get(key) != after.get(key)}
    assert changed <= {"uncertainty", "source", "compute"}
    # no microbenchmarks read: a --data folder without them is no error
    (tmp_path / "empty").mkdir()
    again = RUNNER.invoke(_app(), ["calibrate", "--bands-from", str(tmp_path / "held.csv"), "--output", str(fit),
                                   "--data", str(tmp_path / "empty")])
    assert again.exit_code == 0, (again.output, again.exception)
    # a field the package file leaves at its default is written out, at that default
    assert {k: v for k, v in after["compute"].items() if k in before["compute"]} == before["compute"]


def test_fit_report_shows_the_bands_the_fit_carries(tiny_fit: Path) -> None:
    """The bands are made once: the cross-validation report's are the fit's, the package's fallback included.
    Four runs are too few for a band of their own in any group: every group takes the package's band."""
    cal, package = read_calibration(tiny_fit), read_calibration(None).uncertainty
    report = json.loads((tiny_fit.parent.parent / "report.json").read_text())
    assert cal.uncertainty is not None and package is not None
    assert set(report["bands"]) == set(GROUPS)
    for group, ratios in cal.uncertainty.bands.items():
        theirs = package.bands[group]
        assert (ratios.basis, ratios.residuals) == ("package", theirs.residuals), group
        assert (ratios.low_ratio, ratios.high_ratio) == pytest.approx((theirs.low_ratio, theirs.high_ratio), rel=1e-5)
    for group, ratios in cal.uncertainty.bands.items():  # the fit file keeps 6 significant digits
        shown = report["bands"][group]
        assert (shown["low_ratio"], shown["high_ratio"]) == pytest.approx((ratios.low_ratio, ratios.high_ratio),
                                                                          rel=1e-5)
        assert (shown["residuals"], shown["basis"]) == (ratios.residuals, ratios.basis)


def test_round_trip_of_a_user_fit(tiny_fit: Path) -> None:
    cal = read_calibration(tiny_fit)
    assert cal.fit_report["runs"] == 4
    assert "mine.csv" in cal.source
    assert cal.sim_runtime is None  # --no-sim
    assert not list(tiny_fit.parent.glob(".*"))  # written through a temporary file, renamed
    if cal.uncertainty is not None:  # four runs hold out too few: the package's bands, marked as such
        assert {r.basis for r in cal.uncertainty.bands.values()} == {"package"}
        assert (cal.uncertainty.min_gpus, cal.uncertainty.max_gpus) == (2, 8)


def test_user_fit_changes_predictions(tiny_fit: Path) -> None:
    default = json.loads(RUNNER.invoke(_app(), PREDICT).stdout)
    mine = json.loads(RUNNER.invoke(_app(), [*PREDICT, "--calibration", str(tiny_fit)]).stdout)
    assert mine["iteration_time_s"] != default["iteration_time_s"]


def test_calibration_changes_predict_search_and_validate(tmp_path: Path) -> None:
    """One more second of fixed cost per iteration: every engine's iteration time grows by exactly that."""
    base = read_calibration(None)
    sim_runtime = {**(base.sim_runtime or base.runtime).model_dump(), "iteration_overhead_s": 1.0}  # the
    # simulator falls back to the analytical runtime where the fit has none of its own
    slower = _calibration_file(tmp_path / "slower.yaml", {"runtime": {"iteration_overhead_s": 1.0},
                                                          "sim_runtime": sim_runtime})
    for engine, runtime in (("analytical", base.runtime), ("sim", base.sim_runtime or base.runtime)):
        default = json.loads(RUNNER.invoke(_app(), [*PREDICT, "--engine", engine]).stdout)
        mine = json.loads(RUNNER.invoke(_app(), [*PREDICT, "--engine", engine, "--calibration", str(slower)]).stdout)
        grown = mine["iteration_time_s"] - default["iteration_time_s"]
        assert grown == pytest.approx(1.0 - runtime.iteration_overhead_s, rel=1e-9), engine

    search = ["search", "--model", "gpt3-125m", "--num-gpus", "8", "--global-batch", "16", "--top-k", "1", "--json"]
    best = json.loads(RUNNER.invoke(_app(), search).stdout)["plans"][0]
    slow_best = json.loads(RUNNER.invoke(_app(), [*search, "--calibration", str(slower)]).stdout)["plans"][0]
    assert slow_best["iteration_time_s"] > best["iteration_time_s"] + 0.9

    runs = str(_tiny_runs(tmp_path / "runs.csv", per_source=1))
    rows = json.loads(RUNNER.invoke(_app(), ["validate", runs, "--json"]).stdout)["runs"]
    slow_rows = json.loads(RUNNER.invoke(_app(), ["validate", runs, "--json", "--calibration", str(slower)]).stdout)
    for row, slow in zip(rows, slow_rows["runs"], strict=True):
        assert slow["predicted"] - row["predicted"] == pytest.approx(1.0 - base.runtime.iteration_overhead_s)


def test_job_file_names_its_calibration(tmp_path: Path) -> None:
    _calibration_file(tmp_path / "slower.yaml", {"runtime": {"iteration_overhead_s": 1.0}})
    (tmp_path / "job.yaml").write_text("model: gpt3-125m\nglobal_batch: 16\ncalibration: slower.yaml\n")
    default = json.loads(RUNNER.invoke(_app(), PREDICT).stdout)
    mine = json.loads(RUNNER.invoke(_app(), ["predict", str(tmp_path / "job.yaml"), "--json"]).stdout)
    assert mine["iteration_time_s"] > default["iteration_time_s"] + 0.9


def test_predict_json_carries_the_band(tmp_path: Path) -> None:
    cal = _calibration_file(tmp_path / "banded.yaml", {"uncertainty": _bands(0.8, 1.25)})
    data = json.loads(RUNNER.invoke(_app(), [*PREDICT, "--calibration", str(cal)]).stdout)
    band = data["band"]
    point = data["iteration_time_s"]
    assert band["iteration_time_s"] == pytest.approx([0.8 * point, 1.25 * point], rel=1e-12)
    assert band["group"] == "unknown-stack/inside-scale"  # no stack stated; 8 GPUs within 2-256
    assert band["coverage"] == pytest.approx(0.8)
    for name in ("tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu", "hfu"):
        low, high = band[name]
        assert low == pytest.approx(data[name] / 1.25, rel=1e-12) and high == pytest.approx(data[name] / 0.8)
    large = ["predict", "--model", "gpt3-125m", "--num-gpus", "512", "--global-batch", "512", "--json"]
    outside = json.loads(RUNNER.invoke(_app(), [*large, "--calibration", str(cal)]).stdout)
    assert outside["band"]["group"] == "unknown-stack/outside-scale"
    sim = json.loads(RUNNER.invoke(_app(), [*PREDICT, "--engine", "sim", "--calibration", str(cal)]).stdout)
    assert sim["band"]["iteration_time_s"] == pytest.approx([0.8 * sim["iteration_time_s"],
                                                             1.25 * sim["iteration_time_s"]], rel=1e-12)
    text = RUNNER.invoke(_app(), [*PREDICT[:-1], "--calibration", str(cal)]).stdout
    assert "80% band" in text and "unknown-stack" not in text  # the group in words


def test_band_holds_the_point_even_when_biased(tmp_path: Path) -> None:
    cal = _calibration_file(tmp_path / "biased.yaml", {"uncertainty": _bands(1.1, 1.3)})
    data = json.loads(RUNNER.invoke(_app(), [*PREDICT, "--calibration", str(cal)]).stdout)
    low, high = data["band"]["iteration_time_s"]
    assert low == data["iteration_time_s"] and high == pytest.approx(1.3 * low)


def test_package_fit_band_on_predict() -> None:
    data = json.loads(RUNNER.invoke(_app(), PREDICT).stdout)
    if read_calibration(None).uncertainty is None:
        assert "band" not in data  # absent parts are left out of the JSON
        return
    low, high = data["band"]["iteration_time_s"]
    assert low <= data["iteration_time_s"] <= high and low < high
    for name in ("tokens_per_s", "mfu"):
        assert data["band"][name][0] <= data[name] <= data["band"][name][1]


def test_engines_without_measured_errors_carry_no_band() -> None:
    data = json.loads(RUNNER.invoke(_app(), [*PREDICT, "--engine", "precision-aware"]).stdout)
    assert "band" not in data  # absent parts are left out of the JSON


def test_never_overwrites_the_package_fit(tmp_path: Path) -> None:
    before = FITTED_PATH.read_bytes()
    _one_error_line(RUNNER.invoke(_app(), ["calibrate"]), "--output", "--update-package")
    _one_error_line(RUNNER.invoke(_app(), ["calibrate", "--output", str(FITTED_PATH)]), "--update-package")
    _one_error_line(RUNNER.invoke(_app(), ["calibrate", "--output", str(tmp_path / "x.yaml"), "--update-package"]),
                    "not both")
    assert FITTED_PATH.read_bytes() == before


@pytest.mark.parametrize(("args", "fragments"), [
    (["--folds", "1"], ("folds=1", "2 or more")),
    (["--workers", "0"], ("workers=0", "1 to 64")),
    (["--tolerance", "nan"], ("tolerance=nan", "between 1e-12 and 0.01")),
    (["--start", "MISSING"], ("does not exist",)),
    (["--data", "EMPTY"], ("lacks gemm.csv, collectives.csv",)),
    (["--runs", "MISSING"], ("cannot read",)),
    (["--runs", "NO_COLUMNS"], ("lacks the columns",)),
    (["--runs", "NO_RUNS"], ("no run with a metric iteration_time_s",)),
    (["--output", "FOLDER"], ("is a folder",)),
    (["--bands-from", "MISSING"], ("held_out=", "not a file of held-out predictions")),
    (["--bands-from", "NO_COLUMNS"], ("held_out=", "scheme, split, run_id")),
    (["--bands-from", "NO_COLUMNS", "--cross-validate"], ("bands_from=", "--cross-validate makes no fit")),
])
def test_bad_calibrate_inputs(tmp_path: Path, args: list[str], fragments: tuple[str, ...]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_columns.csv").write_text("run_id,value\nx,1\n")
    header = (MEASUREMENTS_DIR / "runs.csv").read_text().splitlines()[0]
    (tmp_path / "no_runs.csv").write_text(header + "\n")
    names = {"EMPTY": "empty", "MISSING": "missing.csv", "NO_COLUMNS": "no_columns.csv", "NO_RUNS": "no_runs.csv",
             "FOLDER": "empty"}
    args = [str(tmp_path / names[a]) if a in names else a for a in args]
    output = [] if "--output" in args else ["--output", str(tmp_path / "out.yaml")]
    _one_error_line(RUNNER.invoke(_app(), ["calibrate", *output, *args]), *fragments)
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.parametrize(("content", "fragment"), [
    (None, "does not exist"),
    ("compute: [unclosed\n", "is not valid YAML"),
    ("- a list\n", "mapping at the top level"),
    ("surprise: 1\n", "surprise"),
    ("runtime: {dp_overlap: 2.0}\n", "runtime.dp_overlap"),
    ("uncertainty: {min_gpus: 1, max_gpus: 8, bands: {}}\n", "lacks the groups"),
])
def test_bad_calibration_file(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "cal.yaml"
    if content is not None:
        path.write_text(content)
    for command in (PREDICT, ["search", "--global-batch", "16", "--json"], ["validate", str(tmp_path / "x.csv")]):
        _one_error_line(RUNNER.invoke(_app(), [*command, "--calibration", str(path)]), fragment)


def test_bad_calibration_in_a_job_file(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("model: gpt3-125m\nglobal_batch: 16\ncalibration: 3\n")
    _one_error_line(RUNNER.invoke(_app(), ["predict", str(tmp_path / "job.yaml")]), "calibration", "path")
    (tmp_path / "job.yaml").write_text("model: gpt3-125m\nglobal_batch: 16\ncalibration: missing.yaml\n")
    _one_error_line(RUNNER.invoke(_app(), ["predict", str(tmp_path / "job.yaml")]), "missing.yaml", "does not exist")
