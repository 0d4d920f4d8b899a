"""Cross-validation splits and the bands from held-out predictions (no fits: synthetic held-out records)."""

import math

import numpy as np
import pytest

from trainsim.calibrate.bands import MIN_GROUP_RESIDUALS, BandRule, HeldOut, coverage, uncertainty_of
from trainsim.calibrate.crossval import SCALE_TEST_GPUS, SCALE_TRAIN_MAX_GPUS, splits, stack_key, summary
from trainsim.calibrate.fit import read_samples
from trainsim.calibrate.runs import FitSample
from trainsim.catalog.calibration import MEASUREMENTS_DIR
from trainsim.catalog.uncertainty import GROUPS, BandRatios, Uncertainty


@pytest.fixture(scope="module")
def samples() -> list[FitSample]:
    """Every run of the package's multi-node file (16-256 GPUs, three sources)."""
    return read_samples([MEASUREMENTS_DIR / "runs_multinode.csv"])


def _record(sample: FitSample, log_error: float, group: str = "known-stack/inside-scale",
            scheme: str = "k-fold") -> HeldOut:
    return HeldOut(scheme, "test", sample.run_id, sample.source, sample.job.num_gpus, log_error, group)


def test_kfold_holds_out_every_run_once(samples: list[FitSample]) -> None:
    folds = [s for s in splits(samples, folds=4) if s.scheme == "k-fold"]
    assert len(folds) == 4
    held = [sample.run_id for split in folds for sample in split.test]
    assert sorted(held) == sorted(s.run_id for s in samples)
    for split in folds:
        assert {s.run_id for s in split.train}.isdisjoint(s.run_id for s in split.test)
        assert len(split.train) + len(split.test) == len(samples)


def test_leave_one_source_out_and_scale(samples: list[FitSample]) -> None:
    by_scheme = {(s.scheme, s.name): s for s in splits(samples, folds=2)}
    sources = sorted({s.source for s in samples})
    for source in sources:
        split = by_scheme[("leave-one-source-out", f"without {source}")]
        assert {s.source for s in split.test} == {source}
        assert source not in {s.source for s in split.train}
    scale = [s for key, s in by_scheme.items() if key[0] == "scale-extrapolation"]
    assert len(scale) == 1
    assert max(s.job.num_gpus for s in scale[0].train) <= SCALE_TRAIN_MAX_GPUS
    assert {s.job.num_gpus for s in scale[0].test} == set(SCALE_TEST_GPUS)


def test_one_run_allows_no_split(samples: list[FitSample]) -> None:
    assert splits(samples[:1]) == []


def test_stack_key_falls_back_to_the_source(samples: list[FitSample]) -> None:
    stack = getattr(samples[0].job, "stack", None)
    expected = stack.name if stack is not None else f"source {samples[0].source}"
    assert stack_key(samples[0]) == expected


def test_quantiles_per_group_counting_runs(samples: list[FitSample]) -> None:
    errors = np.linspace(-0.2, 0.2, 41)  # log(predicted / measured)
    records = [_record(samples[i % len(samples)], float(e)) for i, e in enumerate(errors)]
    uncertainty = uncertainty_of(records, samples, rule=BandRule("runs", "quantiles", "flat"))
    assert uncertainty is not None
    ratios = uncertainty.bands["known-stack/inside-scale"]
    # measured / predicted = exp(-error): its 10% and 90% quantiles are exp(-0.16) and exp(0.16)
    assert ratios.low_ratio == pytest.approx(math.exp(-0.16))
    assert ratios.high_ratio == pytest.approx(math.exp(0.16))
    assert (ratios.residuals, ratios.basis) == (41, "own")
    for group in GROUPS[1:]:  # no held-out runs of their own: every group's together
        assert uncertainty.bands[group].basis == "pooled"
        assert uncertainty.bands[group].low_ratio == ratios.low_ratio
    assert (uncertainty.min_gpus, uncertainty.max_gpus) == (16, 256)
    # 33 of the 41 runs (errors -0.16 ... 0.16) lie inside the band, the ends included
    assert coverage(records, uncertainty) == pytest.approx(33 / 41)


def test_too_few_runs_take_the_package_band(samples: list[FitSample]) -> None:
    records = [_record(samples[0], 0.1)] * (MIN_GROUP_RESIDUALS - 1)
    assert uncertainty_of(records, samples) is None
    package = Uncertainty(min_gpus=1, max_gpus=8, bands={
        group: BandRatios(low_ratio=0.8, high_ratio=1.2, residuals=100) for group in GROUPS})
    fallback = uncertainty_of(records, samples, package)
    assert fallback is not None
    assert {r.basis for r in fallback.bands.values()} == {"package"}
    assert fallback.bands[GROUPS[0]].low_ratio == 0.8
    assert (fallback.min_gpus, fallback.max_gpus) == (16, 256)  # the range of the runs fitted, not the package's


def test_summary_reports_mape_and_coverage_per_scheme(samples: list[FitSample]) -> None:
    records = [_record(s, 0.1 if i % 2 else -0.1, scheme=scheme)
               for i, s in enumerate(samples) for scheme in ("k-fold", "leave-one-source-out")]
    report = summary(records, samples, uncertainty_of(records, samples))
    mape = report["mape_pct"]
    assert isinstance(mape, dict)
    errors = [abs(math.exp(0.1 if i % 2 else -0.1) - 1) * 100 for i in range(len(samples))]
    assert mape["k-fold"]["ALL"] == pytest.approx(sum(errors) / len(errors), rel=1e-12)
    assert "scale-extrapolation" not in mape
    assert report["runs"] == {"k-fold": len(samples), "leave-one-source-out": len(samples),
                              "scale-extrapolation": 0}
    assert set(report["coverage_new_source_pct"]) == {*{s.source for s in samples}, "mean", "ALL"}  # type: ignore[arg-type]


def test_package_fit_has_bands_over_its_runs() -> None:
    from trainsim.catalog.calibration import load_calibration

    uncertainty = load_calibration().uncertainty
    if uncertainty is None:
        pytest.skip("the package fit predates the bands: rerun trainsim calibrate --update-package")
    assert set(uncertainty.bands) == set(GROUPS)
    assert (uncertainty.min_gpus, uncertainty.max_gpus) == (2, 256)
    for ratios in uncertainty.bands.values():
        assert ratios.low_ratio < 1.0 < ratios.high_ratio
        assert ratios.residuals >= MIN_GROUP_RESIDUALS



def _fake_held_out(base: object, split: object, progress: object = None, start: object = None,
                   tolerance: object = None) -> list[HeldOut]:
    """A stand-in for a split's fit: one record per test run, its error a function of the run (no fitting)."""
    return [HeldOut(split.scheme, split.name, s.run_id, s.source, s.job.num_gpus,  # type: ignore[attr-defined]
                    0.001 * len(s.run_id), "known-stack/inside-scale") for s in split.test]  # type: ignore[attr-defined]


def test_splits_in_worker_processes_give_the_serial_records_in_order(samples: list[FitSample],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsim.calibrate import fit

    monkeypatch.setattr(fit, "held_out", _fake_held_out)
    plan = splits(samples, 3)
    serial = fit._held_out_all(None, plan, fit.FitProgress(), 0, len(plan), None)  # type: ignore[arg-type]
    parallel = fit._held_out_all(None, plan, fit.FitProgress(), 0, len(plan), None, workers=2)  # type: ignore[arg-type]
    assert len(serial) > len(plan)
    assert parallel == serial


def test_cross_validate_starts_its_fit_on_all_runs_from_the_given_fit(samples: list[FitSample],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--cross-validate --start FIT --tolerance T: the fit on all runs (the splits' start) starts from FIT to T."""
    from trainsim.calibrate import fit
    from trainsim.catalog.calibration import Calibration

    seen: list[tuple[object, float]] = []
    marker = Calibration(source="marker")

    def fake_fit(base: object, runs: object, progress: object = None, start: object = None, workers: int = 1,
                 tolerance: float = 1e-8) -> Calibration:
        seen.append((start, tolerance))
        return Calibration(source="all runs")

    monkeypatch.setattr(fit, "read_samples", lambda files: samples)
    monkeypatch.setattr(fit, "fit_micro", lambda data_dir: Calibration())
    monkeypatch.setattr(fit, "fit_runtime", fake_fit)
    monkeypatch.setattr(fit, "held_out", _fake_held_out)
    fit.cross_validate(start=marker, tolerance=1e-4)
    assert seen == [(marker, 1e-4)]
