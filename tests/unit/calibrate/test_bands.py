"""The bands from held-out predictions: the rules (conformal quantile, source weights, pooling into the parent
group) on hand-computed cases, the honest (source held out) coverage, the held-out file, and properties of every
band (finite, ordered, holding the point)."""

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.calibrate.bands import (
    BAND_POOLINGS,
    BAND_RULE,
    BAND_SHAPES,
    BAND_WEIGHTS,
    MIN_GROUP_RESIDUALS,
    PREVIOUS_RULE,
    BandRule,
    HeldOut,
    conformal_level,
    held_out_csv,
    new_source_coverage,
    read_held_out,
    source_weights,
    uncertainty_of,
    weighted_quantile,
)
from trainsim.calibrate.fit import read_samples
from trainsim.calibrate.runs import FitSample
from trainsim.catalog.calibration import MEASUREMENTS_DIR, Calibration
from trainsim.catalog.uncertainty import GROUPS, BandRatios, Uncertainty
from trainsim.errors import InputFileError
from trainsim.estimate.result import iteration_band

KNOWN_INSIDE = "known-stack/inside-scale"
SOURCE_QUANTILES = BandRule("sources", "quantiles", "flat")
RUN_QUANTILES = BandRule("runs", "quantiles", "flat")  # the first bands' rule


@pytest.fixture(scope="module")
def samples() -> list[FitSample]:
    return read_samples([MEASUREMENTS_DIR / "runs_multinode.csv"])


def _record(source: str, log_ratio: float, group: str = KNOWN_INSIDE, scheme: str = "k-fold",
            run: int = 0) -> HeldOut:
    """A held-out prediction whose measured / predicted is exp(log_ratio)."""
    return HeldOut(scheme, "test", f"{source}-{run}", source, 8, -log_ratio, group)


def test_weighted_quantile_is_the_inverse_of_the_weighted_cdf() -> None:
    # equal weights: the smallest value whose share of the runs at or below it reaches q
    assert weighted_quantile([4.0, 1.0, 3.0, 2.0], [1, 1, 1, 1], 0.25) == 1.0
    assert weighted_quantile([4.0, 1.0, 3.0, 2.0], [1, 1, 1, 1], 0.3) == 2.0
    assert weighted_quantile([4.0, 1.0, 3.0, 2.0], [1, 1, 1, 1], 1.0) == 4.0
    # weights 1/2, 1/4, 1/4 on 0, 1, 2: cumulative 1/2, 3/4, 1
    values, weights = [2.0, 0.0, 1.0], [0.25, 0.5, 0.25]
    assert [weighted_quantile(values, weights, q) for q in (0.1, 0.5, 0.6, 0.75, 0.9)] == [0, 0, 1, 1, 2]
    # thirds: 1/3 + 1/3 + 1/3 reaches q = 1 despite rounding
    assert weighted_quantile([0.0, 1.0, 2.0], [1 / 3] * 3, 1.0) == 2.0


@pytest.mark.parametrize(("values", "weights", "q"), [([], [], 0.5), ([1.0], [1.0, 2.0], 0.5),
                                                       ([1.0], [0.0], 0.5), ([1.0], [1.0], 1.5)])
def test_weighted_quantile_refuses_bad_input(values: list[float], weights: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        weighted_quantile(values, weights, q)


def test_every_source_weighs_one() -> None:
    records = [_record("a", 0.0, run=i) for i in range(3)] + [_record("b", 0.0)]
    assert source_weights(records) == [1 / 3, 1 / 3, 1 / 3, 1.0]


def _two_sources() -> list[HeldOut]:
    """Source a: 20 runs, log ratios 0.00 ... 0.19; source b: 10 runs, all 0.5 (a source with its own bias)."""
    return ([_record("a", 0.01 * i, run=i) for i in range(20)] +
            [_record("b", 0.5, run=i) for i in range(10)])


def test_quantile_band_counts_every_source_once(samples: list[FitSample]) -> None:
    records = _two_sources()
    by_source = uncertainty_of(records, samples, rule=SOURCE_QUANTILES)
    by_run = uncertainty_of(records, samples, rule=RUN_QUANTILES)
    assert by_source is not None and by_run is not None
    band = by_source.bands[KNOWN_INSIDE]
    # weights 1/20 (a) and 1/10 (b), total 2: 10% of it (0.2) is reached at a's 4th run (0.03); 90% (1.8) at b's
    # 8th (0.5)
    assert (band.low_ratio, band.high_ratio) == (math.exp(0.03), math.exp(0.5))
    assert (band.residuals, band.basis) == (30, "own")
    # every run once (numpy's linear quantile of 30 values): 10% at position 2.9 (0.029), 90% at 26.1 (0.5)
    runs = by_run.bands[KNOWN_INSIDE]
    assert runs.low_ratio == pytest.approx(math.exp(0.029), rel=1e-12)
    assert runs.high_ratio == pytest.approx(math.exp(0.5), rel=1e-12)


def test_a_group_of_one_source_takes_the_pooled_band(samples: list[FitSample]) -> None:
    records = [_record("a", 0.01 * i, run=i) for i in range(MIN_GROUP_RESIDUALS)]
    records += [_record("b", 0.3, group="unknown-stack/inside-scale", run=i) for i in range(MIN_GROUP_RESIDUALS)]
    bands = uncertainty_of(records, samples, rule=SOURCE_QUANTILES)
    assert bands is not None
    assert {bands.bands[group].basis for group in GROUPS} == {"pooled"}
    # pooled: 20 runs of a at 1/20, 20 of b at 1/20; 10% of 2 (0.2) at a's 4th run, 90% (1.8) at b's 16th
    assert bands.bands[KNOWN_INSIDE].low_ratio == math.exp(0.03)
    assert bands.bands[KNOWN_INSIDE].high_ratio == math.exp(0.3)
    by_run = uncertainty_of(records, samples, rule=PREVIOUS_RULE)
    assert by_run is not None and by_run.bands[KNOWN_INSIDE].basis == "own"


def test_conformal_level_is_the_finite_sample_count() -> None:
    # ceil((n + 1) x 0.8) of n: 17 of 20, 20 of 24 (exactly 20.0: no rounding up), 4 of 4
    assert conformal_level(20) == 17 / 20
    assert conformal_level(24) == 20 / 24
    assert conformal_level(4) == 1.0
    assert conformal_level(9, coverage=0.5) == 5 / 9
    with pytest.raises(ValueError, match="too few"):
        conformal_level(3)  # 4 x 0.8 = 3.2: the 4th of 3
    with pytest.raises(ValueError):
        conformal_level(0)


def test_symmetric_band_is_the_80_percent_quantile_of_the_absolute_log_ratio(samples: list[FitSample]) -> None:
    # log ratios in 64ths (exact): source a at 0, -1, ..., -19; source b, 10 runs at +3
    records = ([_record("a", -i / 64, run=i) for i in range(20)] + [_record("b", 3 / 64, run=i) for i in range(10)])
    # |log ratio| sorted 0, 1, 2, eleven 3s, 4, ..., 19. The rule in use, the conformal quantile: the
    # ceil(31 x 0.8) = 25th of 30, 14; the rule before, the plain 80% of 30 runs: the 24th, 13
    band = uncertainty_of(records, samples)
    before = uncertainty_of(records, samples, rule=PREVIOUS_RULE)
    assert band is not None and before is not None and (BAND_RULE.weight, BAND_RULE.shape) == ("runs", "conformal")
    ratios = band.bands[KNOWN_INSIDE]
    assert (ratios.low_ratio, ratios.high_ratio) == (math.exp(-14 / 64), math.exp(14 / 64))
    assert before.bands[KNOWN_INSIDE].high_ratio == math.exp(13 / 64)
    # every source once: weights 1/20 (a) and 1/10 (b), total 2: 0, 1, 2 (0.15), the eleven 3s (1.2), then 0.05
    # a step: 80% of 2 (1.6) at 11
    by_source = uncertainty_of(records, samples, rule=BandRule("sources", "symmetric", "flat"))
    assert by_source is not None
    assert by_source.bands[KNOWN_INSIDE].high_ratio == math.exp(11 / 64)


def test_a_group_of_one_source_takes_its_parent_groups_band(samples: list[FitSample]) -> None:
    # unknown stack inside the GPU range: sources c and d, |log ratio| 1 ... 20 and 21 ... 40 (64ths); outside:
    # source e alone, 20 runs at 0; known stack inside: sources a and b, 10 runs each at 1/64
    unknown_inside = "unknown-stack/inside-scale"
    unknown_outside = "unknown-stack/outside-scale"
    records = ([_record("c", i / 64, unknown_inside, run=i) for i in range(1, 21)] +
               [_record("d", -i / 64, unknown_inside, run=i) for i in range(21, 41)] +
               [_record("e", 0.0, unknown_outside, run=i) for i in range(20)] +
               [_record(source, 1 / 64, run=i) for source in "ab" for i in range(10)])
    bands = uncertainty_of(records, samples)
    assert bands is not None
    got = {group: (ratios.basis, ratios.residuals, ratios.high_ratio) for group, ratios in bands.bands.items()}
    # inside: its own 40, the ceil(41 x 0.8) = 33rd; outside: one source, so the unknown side's 60: 20 zeros,
    # then 1 ... 40, the ceil(61 x 0.8) = 49th is 29; known outside: none, the known side's 20, all 1
    assert got == {unknown_inside: ("own", 40, math.exp(33 / 64)),
                   unknown_outside: ("scales-pooled", 60, math.exp(29 / 64)),
                   KNOWN_INSIDE: ("own", 20, math.exp(1 / 64)),
                   "known-stack/outside-scale": ("scales-pooled", 20, math.exp(1 / 64))}
    # the rule before: one source's 20 runs are enough, and an empty group takes every record's band (80 of
    # them: 40 at 0 or 1/64, then 1 ... 40; the 64th is 24)
    flat = uncertainty_of(records, samples, rule=PREVIOUS_RULE)
    assert flat is not None
    assert (flat.bands[unknown_outside].basis, flat.bands[unknown_outside].high_ratio) == ("own", 1.0)
    assert flat.bands["known-stack/outside-scale"].basis == "pooled"
    assert flat.bands["known-stack/outside-scale"].high_ratio == math.exp(24 / 64)


def test_one_source_of_ones_own_keeps_its_known_stack_bands(samples: list[FitSample]) -> None:
    # a user's cluster: one source, 30 k-fold runs of its own stack at |log ratio| 1 ... 30 (64ths). The known
    # stack's bands come from them; an unknown stack's cannot (one stack's errors), so they are the package's
    records = [_record("mine", (-1) ** i * i / 64, run=i) for i in range(1, 31)]
    package = Uncertainty(min_gpus=1, max_gpus=8, bands={
        group: BandRatios(low_ratio=0.5, high_ratio=2.0, residuals=99) for group in GROUPS})
    bands = uncertainty_of(records, samples, fallback=package)
    assert bands is not None
    got = {group: (ratios.basis, ratios.high_ratio) for group, ratios in bands.bands.items()}
    # ceil(31 x 0.8) = 25th of 30: 25
    assert got == {KNOWN_INSIDE: ("own", math.exp(25 / 64)),
                   "known-stack/outside-scale": ("scales-pooled", math.exp(25 / 64)),
                   "unknown-stack/inside-scale": ("package", 2.0), "unknown-stack/outside-scale": ("package", 2.0)}
    assert uncertainty_of(records, samples) is None  # no package fit to fall back on


def test_new_source_coverage_holds_each_source_out_of_the_band(samples: list[FitSample]) -> None:
    # three sources, 20 runs each, log ratios in 64ths (exact): a at -10 ... 9, b at -5 ... 14, c all at 64
    records = ([_record("a", (i - 10) / 64, run=i) for i in range(20)] +
               [_record("b", (i - 5) / 64, run=i) for i in range(20)] +
               [_record("c", 1.0, run=i) for i in range(20)])
    honest = new_source_coverage(records, samples, rule=SOURCE_QUANTILES)
    # without a: b and c at 1/20 each, total 2: 10% (0.2) at b's 4th (-2/64), 90% (1.8) at c's 1.0; a's runs
    # from -2/64 up are inside: 12 of 20
    assert honest["a"] == pytest.approx(12 / 20 * 100)
    # without b: [a's 4th = -7/64, 1.0]: every run of b inside
    assert honest["b"] == pytest.approx(100.0)
    # without c: a and b, 40 runs at 1/20: 10% at the 4th smallest (-7/64), 90% at the 36th, the 5th largest
    # (b's 10/64): c's 1.0 outside
    assert honest["c"] == 0.0
    assert honest["ALL"] == pytest.approx(32 / 60 * 100)
    assert honest["mean"] == pytest.approx((60 + 100 + 0) / 3)


def test_held_out_file_round_trips_exactly(tmp_path: Path) -> None:
    odd = _record("c", -1 / 3, group="unknown-stack/outside-scale", scheme="leave-one-source-out")
    records = [*_two_sources(), odd]
    path = tmp_path / "held.csv"
    path.write_text(held_out_csv(records))
    assert read_held_out(path) == records


@pytest.mark.parametrize(("text", "message"), [
    ("scheme,split\nk-fold,x\n", "not a file of held-out predictions"),
    ("scheme,split,run_id,source,num_gpus,log_error,group\nk-fold,x,r,s,8,0.1,elsewhere\n", "unknown groups"),
    ("scheme,split,run_id,source,num_gpus,log_error,group\nk-fold,x,r,s,8,nan,known-stack/inside-scale\n",
     "finite"),
])
def test_bad_held_out_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "held.csv"
    path.write_text(text)
    with pytest.raises(InputFileError, match=message):
        read_held_out(path)


_held_out_records = st.lists(
    st.builds(_record, st.sampled_from(["a", "b", "c"]),
              st.floats(min_value=-3.0, max_value=3.0, allow_nan=False), st.sampled_from(GROUPS),
              st.sampled_from(["k-fold", "leave-one-source-out"]), st.integers(0, 1000)),
    min_size=MIN_GROUP_RESIDUALS, max_size=120)


@settings(max_examples=60, deadline=None)
@given(records=_held_out_records, point_s=st.floats(min_value=1e-6, max_value=1e4),
       rule=st.builds(BandRule, st.sampled_from(BAND_WEIGHTS), st.sampled_from(BAND_SHAPES),
                      st.sampled_from(BAND_POOLINGS)))
def test_every_band_is_finite_ordered_and_holds_the_point(samples: list[FitSample], records: list[HeldOut],
                                                          point_s: float, rule: BandRule) -> None:
    uncertainty = uncertainty_of(records, samples, rule=rule)
    if uncertainty is None:  # all records from one source: too few sources for any band
        assert (rule.weight == "sources" or rule.pooling == "parent") and len({r.source for r in records}) == 1
        return
    calibration = Calibration(uncertainty=uncertainty)
    for sample in samples[:: max(1, len(samples) // 10)]:
        band = iteration_band(sample.job, point_s, calibration)
        assert band is not None
        assert math.isfinite(band.low_s) and math.isfinite(band.high_s)
        assert 0 < band.low_s <= point_s <= band.high_s
    for group in GROUPS:
        ratios = uncertainty.bands[group]
        assert 0 < ratios.low_ratio <= ratios.high_ratio
        assert math.isfinite(ratios.low_ratio) and math.isfinite(ratios.high_ratio)
        if rule.shape != "quantiles":
            assert ratios.low_ratio * ratios.high_ratio == pytest.approx(1.0, rel=1e-12)



def test_package_bands_come_from_the_stored_held_out_predictions() -> None:
    """The package fit's bands are the rule's on results/bands/package_held_out.csv (README, "Held-out runs"):
    after a refit, write its --held-out file there and make the bands with `trainsim calibrate --bands-from`."""
    from conftest import REPO_DIR
    from trainsim.calibrate.fit import default_runs_files
    from trainsim.catalog.calibration import load_calibration

    stored = REPO_DIR / "results" / "bands" / "package_held_out.csv"
    package = load_calibration().uncertainty
    if package is None or not stored.is_file():
        pytest.skip("no package bands or no stored held-out predictions")
    expected = uncertainty_of(read_held_out(stored), read_samples(default_runs_files()))
    assert expected is not None
    for group in GROUPS:  # the fit file keeps 6 significant digits
        got, want = package.bands[group], expected.bands[group]
        assert (got.low_ratio, got.high_ratio) == pytest.approx((want.low_ratio, want.high_ratio), rel=1e-5)
        assert (got.residuals, got.basis) == (want.residuals, want.basis)
