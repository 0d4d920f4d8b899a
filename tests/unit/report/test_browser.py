"""The HTML reports as a person sees them: opened in a real headless Chromium (the system's, driven by its own
--dump-dom and --screenshot), every chart renders and the console stays clean.

Skipped, with the reason printed (pytest -rs), only where no Chromium is installed; `.ci/run` installs Debian's
`chromium` package first.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import trainsim
from trainsim.report import html as html_report

pytest.importorskip("plotly")

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((found for name in BROWSERS if (found := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="browser check skipped: no Chromium on this machine "
                                "(apt-get install chromium)")
# Chromium's own flags: no sandbox (root in containers), no GPU, and virtual time so scripts finish first.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=15000",
         "--enable-logging=stderr", "--v=0")
CONSOLE = re.compile(r":CONSOLE[^\]]*\] \"(.*)\", source: (.*)$")


def open_in_browser(page: Path, *extra: str) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and what they wrote to the console."""
    assert BROWSER is not None
    done = subprocess.run([BROWSER, *FLAGS, *extra, "--dump-dom", page.resolve().as_uri()], capture_output=True,
                          text=True, timeout=180, check=True)
    console = [match.group(1) for line in done.stderr.splitlines() if (match := CONSOLE.search(line))]
    return done.stdout, console


def rendered_charts(dom: str) -> set[str]:
    """The charts plotly drew: their div gets the class js-plotly-plot and an <svg class="main-svg">."""
    drawn = set()
    for match in re.finditer(r'<div id="fig-([\w-]+)" class="([^"]*)"', dom):
        following = dom[match.end():match.end() + 4000]
        if "js-plotly-plot" in match.group(2) and 'class="main-svg"' in following:
            drawn.add(match.group(1))
    return drawn


def test_the_check_sees_a_broken_page(tmp_path: Path) -> None:
    """Negative control: a script error reaches the console check, an undrawn chart the render check."""
    page = tmp_path / "broken.html"
    page.write_text('<html><body><div id="fig-x" class="plotly-graph-div"></div>'
                    '<script>throw new Error("boom")</script></body></html>')
    dom, console = open_in_browser(page)
    assert any("boom" in line for line in console)
    assert rendered_charts(dom) == set()


def test_prediction_report_renders_every_chart_without_console_errors(tmp_path: Path) -> None:
    prediction = trainsim.simulate(model="gpt3-125m", num_gpus=8, pp=2, global_batch=16)
    page = prediction.write_html(tmp_path / "r.html")
    dom, console = open_in_browser(page)
    assert console == []
    assert rendered_charts(dom) == {"time-breakdown", "memory-breakdown", "timeline", "memory-timeline", "band"}
    shot = tmp_path / "r.png"
    subprocess.run([BROWSER or "", *FLAGS, "--window-size=1200,2400", f"--screenshot={shot}", page.resolve().as_uri()],
                   capture_output=True, timeout=180, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000  # a drawn page, not blank


def test_search_and_validation_reports_render(tmp_path: Path) -> None:
    found = trainsim.search("gpt3-125m", num_gpus=8, global_batch=16, seq_len=256, top_k=3, all_plans=True)
    dom, console = open_in_browser(found.write_html(tmp_path / "s.html"))
    assert console == [] and rendered_charts(dom) == {"throughput-memory", "refusals"}
    runs = [{"run_id": f"r{i}", "source": f"paper-{i % 2} table 1", "metric": "iteration_time_s",
             "measured": 1.0 + i, "predicted": 1.1 + i, "engine": "analytical", "skipped": None} for i in range(4)]
    page = tmp_path / "v.html"
    page.write_text(html_report.validation_page({"runs": runs, "summary": []}))
    dom, console = open_in_browser(page)
    assert console == [] and rendered_charts(dom) == {"scatter-iteration_time_s"}


def test_comparison_report_renders(tmp_path: Path) -> None:
    found = trainsim.compare({"model": "gpt3-125m", "num_gpus": 8, "global_batch": 16},
                             {"model": "gpt3-125m", "num_gpus": 8, "global_batch": 16, "pp": 2})
    dom, console = open_in_browser(found.write_html(tmp_path / "c.html"))
    assert console == [] and rendered_charts(dom) == {"compare-time", "compare-memory"}
