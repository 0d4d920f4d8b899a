"""`trainsim models`, `hardware` and `graph` read well anywhere: on an 80-column terminal every line fits and no
cell is cut (names stay whole, other cells wrap); piped, the output is plain (no escape codes) and every row is
one line; a CPU's sub-TFLOP/s peaks are not printed as 0."""

import re

import pytest
from typer.testing import CliRunner

from trainsim.catalog import list_clusters, list_devices, list_links, list_models
from trainsim.cli.catalog_cmds import _params
from trainsim.cli.main import app
from trainsim.report.catalog import render_hardware, render_models

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def _terminal_texts() -> dict[str, str]:
    models = list_models()
    return {"models": render_models(models, [_params(m) for m in models], terminal=True),
            "hardware": render_hardware(list_devices(), list_links(), list_clusters(), terminal=True)}


@pytest.mark.usefixtures("eighty_columns")
def test_the_catalog_tables_fit_80_columns_without_cutting_a_name() -> None:
    for name, styled in _terminal_texts().items():
        text = ANSI.sub("", styled)
        assert max(len(line) for line in text.splitlines()) <= 80, name
        assert "…" not in text, name
        firsts = {line.split()[0] for line in text.splitlines() if line.startswith(" ") and line.split()}
        names = [m.name for m in list_models()] if name == "models" else [d.name for d in list_devices()]
        assert set(names) <= firsts, name  # the first column is never wrapped or cut


def test_piped_catalogs_are_plain_with_a_line_per_row() -> None:
    for command, names in (("models", [m.name for m in list_models()]),
                           ("hardware", [d.name for d in list_devices()] + [c.name for c in list_clusters()])):
        out = CliRunner().invoke(app, [command])
        assert out.exit_code == 0, out.output
        assert "\x1b[" not in out.stdout and "…" not in out.stdout
        starts = {line.split()[0] for line in out.stdout.splitlines() if line.split()}
        assert set(names) <= starts, command


def test_a_cpu_peak_below_one_tflops_is_not_zero() -> None:
    out = CliRunner().invoke(app, ["hardware"])
    row = next(line for line in out.stdout.splitlines() if line.split() and line.split()[0] == "cpu-local")
    assert row.split()[1:5] == ["0.3", "-", "-", "0.6"]
    a100 = next(line for line in out.stdout.splitlines() if line.split() and line.split()[0] == "a100-sxm4-80gb")
    assert a100.split()[1:5] == ["20", "156", "312", "312"] and a100.split()[-1] == "400"  # max W
