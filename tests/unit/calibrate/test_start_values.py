"""A run-level fit started from an earlier fit takes that fit's values, except a log-space parameter the earlier
fit did not price (0 there: a fit written before the parameter existed), which starts from its own prior."""

from trainsim.calibrate.runs import PARAMETERS, Parameter, _start_value
from trainsim.catalog.calibration import Calibration, ComputeParams, RuntimeParams


def _param(name: str) -> Parameter:
    return next(p for p in PARAMETERS if p.name == name)


def test_a_log_parameter_at_zero_starts_from_its_prior() -> None:
    old_fit = Calibration(compute=ComputeParams(attention_half_kv_tokens=0.0))
    half = _param("attention_half_kv_tokens")
    assert half.log and half.prior == 1024.0
    assert _start_value(half, old_fit, Calibration()) == 1024.0


def test_other_values_start_where_the_earlier_fit_ended() -> None:
    earlier = Calibration(compute=ComputeParams(attention_half_kv_tokens=87.0, attention_efficiency=0.42),
                          runtime=RuntimeParams(overlap_slowdown=0.0))
    assert _start_value(_param("attention_half_kv_tokens"), earlier, Calibration()) == 87.0
    assert _start_value(_param("attention_efficiency"), earlier, Calibration()) == 0.42
    # a linear parameter at 0 is a value, not an absence
    assert _start_value(_param("overlap_slowdown"), earlier, Calibration()) == 0.0
