"""The strategy flags are generated once from ParallelSpec and shared by predict, search and measure."""

from typing import Annotated, Any

import typer
from typer.testing import CliRunner

from trainsim.cli.main import app
from trainsim.cli.measure import MEASURE_FIELDS
from trainsim.cli.search import SEARCH_FIELDS
from trainsim.cli.strategy_options import ALL_FIELDS, GIVEN, StrategyFlags, field_help, strategy_options
from trainsim.strategy.parallel import ATTENTION_KERNELS, RECOMPUTES, SCHEDULES, ParallelSpec
from trainsim.strategy.precision import PRECISIONS


def _options(command: str) -> dict[str, Any]:
    """The command's options by parameter name (typer ships its own click: compare by attributes)."""
    group: Any = typer.main.get_command(app)
    sub = group.get_command(None, command)  # the root group loads a command when asked for it
    return {param.name: param for param in sub.params if getattr(param, "param_type_name", "") == "option"}


def test_every_strategy_field_is_described() -> None:
    assert tuple(ParallelSpec.model_fields) == ALL_FIELDS
    assert all(info.description for info in ParallelSpec.model_fields.values())


def test_predict_takes_every_field_search_and_measure_their_subsets() -> None:
    predict, search, measure = _options("predict"), _options("search"), _options("measure")
    assert set(ALL_FIELDS) <= set(predict)
    assert set(SEARCH_FIELDS) <= set(search) and not (set(ALL_FIELDS) - set(SEARCH_FIELDS)) & set(search)
    assert set(MEASURE_FIELDS) <= set(measure) and "attention" in measure  # flash2 (SDPA) or math (unfused)
    assert "Megatron's unfused" in (measure["attention"].help or "")
    assert predict["micro_batch"].opts == ["--micro-batch"]
    assert predict["optimizer_impl"].opts == ["--optimizer-impl"]
    assert predict["sp"].opts == ["--sp"] and predict["sp"].secondary_opts == ["--no-sp"]
    assert all(predict[field].default is None for field in ALL_FIELDS)  # "not given": a job file's value stands


def test_choices_come_from_the_tuples_that_define_them() -> None:
    assert field_help("schedule") == "pipeline schedule: " + " | ".join(SCHEDULES)
    assert field_help("recompute") == "activation recomputation: " + " | ".join(RECOMPUTES)
    assert field_help("precision", "a note").endswith(" | ".join(PRECISIONS) + "; a note")
    help_text = field_help("attention")
    assert [kernel for kernel in ATTENTION_KERNELS if f"{kernel} (" in help_text] == list(ATTENTION_KERNELS)


def test_the_command_receives_the_given_flags_only() -> None:
    seen: list[dict[str, object]] = []
    tiny = typer.Typer()

    @tiny.command()
    @strategy_options(("tp", "sp", "schedule"))
    def run(name: Annotated[str, typer.Option()] = "x", strategy_flags: StrategyFlags = GIVEN) -> None:
        seen.append({"name": name, **strategy_flags})

    result = CliRunner().invoke(tiny, ["--tp", "2", "--no-sp", "--name", "y"])
    assert result.exit_code == 0, result.output
    assert seen == [{"name": "y", "tp": 2, "sp": False}]
    assert CliRunner().invoke(tiny, ["--pp", "2"]).exit_code == 2  # not among this command's fields
