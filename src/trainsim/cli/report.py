"""`trainsim report RESULT.json --html report.html`: the HTML report of a saved --json result (predict, search or
validate), the same page the command's own --html writes."""

from pathlib import Path
from typing import Annotated

import typer

from trainsim import api
from trainsim.cli.errors import handles_errors
from trainsim.report.html import require_plotly
from trainsim.report.output import check_output_file


@handles_errors
def report(
    result_file: Annotated[Path, typer.Argument(help="the --json output of trainsim predict, search or validate")],
    html: Annotated[Path, typer.Option(help="the HTML file to write (its folder must exist)")],
) -> None:
    """Render a saved result as a self-contained HTML report (needs the report extra: plotly)."""
    check_output_file(html, "html")
    require_plotly()
    api.load(result_file).write_html(html)
    typer.echo(f"report: {html} (open it in a browser; it needs no network)", err=True)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
