"""The HTML report: every chart it promises, self-contained, written atomically into the folder named, and the
one-line refusals that come before any work."""

import html
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trainsim
from trainsim import api
from trainsim.cli.main import app
from trainsim.report import html as html_report

pytest.importorskip("plotly")

RUNNER = CliRunner()
SIM = ["predict", "--model", "gpt3-125m", "--engine", "sim", "--pp", "2", "--global-batch", "16"]
PREDICTION_CHARTS = ("time-breakdown", "memory-breakdown", "timeline", "memory-timeline")


def chart_ids(page: str) -> set[str]:
    """The ids of the plotly charts (divs plotly fills) on a page."""
    return set(re.findall(r'<div id="fig-([\w-]+)" class="plotly-graph-div"', page))


def test_a_simulated_prediction_has_every_chart(tmp_path: Path) -> None:
    out = RUNNER.invoke(app, [*SIM, "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "r.html").read_text()
    assert chart_ids(page) == {*PREDICTION_CHARTS, "band"}  # the package fit's band (calibrate's held-out errors)
    assert "no uncertainty band" not in page
    assert page.count("stage 0 (") > 0 and page.count("stage 1 (") > 0  # a timeline row per pipeline stage
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left behind


def test_the_page_needs_no_network(tmp_path: Path) -> None:
    from plotly.offline import get_plotlyjs

    page = trainsim.predict(model="gpt3-125m").to_html()
    assert page.count(get_plotlyjs()) == 1  # plotly.js inlined, once
    ours = page.replace(get_plotlyjs(), "")  # (the library's own source mentions URLs it never loads here)
    assert "<script src" not in ours and not re.search(r'(src|href)="(https?:)?//', ours)


def test_a_closed_form_prediction_says_why_there_is_no_timeline() -> None:
    page = trainsim.predict(model="gpt3-125m").to_html()
    assert chart_ids(page) == {"time-breakdown", "memory-breakdown", "band"}
    assert 'id="fig-timeline"' in page and "--engine sim" in page


@pytest.mark.parametrize("band", [{"iteration_time_band_s": [0.9, 1.2]},
                                  {"iteration_time_low_s": 0.9, "iteration_time_high_s": 1.2},
                                  {"uncertainty": {"iteration_time_s": {"low": 0.9, "high": 1.2}}}])
def test_an_uncertainty_band_is_drawn_where_the_result_has_one(band: dict) -> None:
    own = {key: value for key, value in trainsim.predict(model="gpt3-125m").to_dict().items() if key != "band"}
    data = {**own, **band}
    assert html_report.band_of(data) == (0.9, 1.2)
    page = html_report.prediction_page(data)
    assert "band" in chart_ids(page) and "900.00 ms - 1.200 s" in page


def test_report_of_a_saved_result_is_the_commands_own_page(tmp_path: Path) -> None:
    saved = RUNNER.invoke(app, [*SIM, "--json"])
    (tmp_path / "r.json").write_text(saved.stdout)
    direct = RUNNER.invoke(app, [*SIM, "--html", str(tmp_path / "direct.html")])
    again = RUNNER.invoke(app, ["report", str(tmp_path / "r.json"), "--html", str(tmp_path / "again.html")])
    assert direct.exit_code == again.exit_code == 0, again.output
    assert (tmp_path / "direct.html").read_text() == (tmp_path / "again.html").read_text()


def test_search_page_has_throughput_memory_and_refusals(tmp_path: Path) -> None:
    args = ["search", "--model", "gpt3-125m", "--num-gpus", "8", "--global-batch", "16", "--seq-len", "256",
            "--top-k", "3", "--html", str(tmp_path / "s.html")]
    out = RUNNER.invoke(app, args)
    assert out.exit_code == 0, out.output
    page = (tmp_path / "s.html").read_text()
    assert chart_ids(page) == {"throughput-memory", "refusals"}
    assert "Pareto front" in page and "tp*pp*cp" in page


def test_validate_page_has_a_scatter_per_metric(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    from conftest import REPO_DIR

    source = (REPO_DIR.parent / "shared" / "data" / "calibration" / "runs.csv")
    if not source.is_file():
        pytest.skip(f"{source} not present")
    lines = source.read_text().splitlines()
    runs.write_text("\n".join(lines[:30]) + "\n")
    out = RUNNER.invoke(app, ["validate", str(runs), "--html", str(tmp_path / "v.html")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "v.html").read_text()
    metrics = {r["metric"] for r in json.loads(RUNNER.invoke(app, ["validate", str(runs), "--json"]).stdout)["runs"]}
    assert chart_ids(page) == {f"scatter-{m}" for m in metrics} and "predicted = measured" in page


@pytest.mark.parametrize("command", [SIM, ["search", "--model", "gpt3-125m", "--global-batch", "8"]])
@pytest.mark.parametrize("where", ["missing/r.html", "."])
def test_html_into_a_missing_folder_or_onto_a_folder_is_one_line_before_any_work(
        command: list[str], where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work ran before the output path was checked")

    monkeypatch.setattr(api, "predict", no_work)
    monkeypatch.setattr(api, "search", no_work)
    out = RUNNER.invoke(app, [*command, "--html", str(tmp_path / where)])
    assert out.exit_code == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: html=")
    assert ("does not exist" in lines[0]) == (where != ".") and ("is a folder" in lines[0]) == (where == ".")


def test_trace_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    out = RUNNER.invoke(app, [*SIM, "--trace", str(tmp_path / "no" / "t.json")])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1 and "trace=" in out.stderr


def test_a_failed_write_leaves_the_earlier_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.html"
    target.write_text("earlier")
    prediction = trainsim.predict(model="gpt3-125m")

    def broken(self: object) -> str:
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(prediction), "to_html", broken)
    with pytest.raises(RuntimeError):
        prediction.write_html(target)
    assert target.read_text() == "earlier"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_report_refuses_a_file_that_is_not_a_result(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"plans": []}')
    out = RUNNER.invoke(app, ["report", str(tmp_path / "x.json"), "--html", str(tmp_path / "x.html")])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1 and "schema" in out.stderr
    assert not (tmp_path / "x.html").exists()


def test_without_plotly_the_html_flag_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def no_plotly(name: str, *args: object, **kwargs: object) -> object:
        if name == "plotly" or name.startswith("plotly."):
            raise ModuleNotFoundError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_plotly)
    out = RUNNER.invoke(app, ["predict", "--model", "gpt3-125m", "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 2 and "pip install 'trainsim[report]'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_compare_html_draws_both_plans_term_by_term(tmp_path: Path) -> None:
    """compare --html: A and B as stacked time and memory bars (one trace per term in either plan), the
    explanation and a row per time term; the saved --json renders the same page through `trainsim report`."""
    for name, extra in (("a.yaml", ""), ("b.yaml", "pp: 2\nrecompute: selective\n")):
        (tmp_path / name).write_text(f"model: gpt3-125m\nnum_gpus: 8\nglobal_batch: 16\n{extra}")
    out = RUNNER.invoke(app, ["compare", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"),
                              "--html", str(tmp_path / "c.html")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "c.html").read_text()
    assert chart_ids(page) == {"compare-time", "compare-memory"}
    found = api.compare(tmp_path / "a.yaml", tmp_path / "b.yaml")
    for line in found.explanation:
        assert html.escape(line) in page
    assert "<td>pipeline bubble</td>" not in page and "<td>bubble</td>" in page  # the keys, as in --json
    assert "<td>recompute</td>" in page
    (tmp_path / "c.json").write_text(found.to_json())
    out = RUNNER.invoke(app, ["report", str(tmp_path / "c.json"), "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    assert chart_ids((tmp_path / "r.html").read_text()) == {"compare-time", "compare-memory"}


def test_compare_html_into_a_missing_folder_fails_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("model: gpt3-125m\n")
    out = RUNNER.invoke(app, ["compare", str(tmp_path / "a.yaml"), str(tmp_path / "a.yaml"),
                              "--html", str(tmp_path / "nope" / "c.html")])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1 and "html" in out.stderr
