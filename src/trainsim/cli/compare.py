"""`trainsim compare A B`: which of two plans is faster and why, term by term. A thin layer over
trainsim.api.comparison (the JSON is `api.compare(...).to_dict()`)."""

from pathlib import Path
from typing import Annotated

import typer

from trainsim import api
from trainsim.cli.errors import handles_errors
from trainsim.cost.pricing import COSTS
from trainsim.errors import ConfigError
from trainsim.estimate.engines import ENGINES
from trainsim.report.html import require_plotly
from trainsim.report.output import check_output_file


@handles_errors
def compare(
    plan_a: Annotated[Path, typer.Argument(help="job file (YAML/JSON) or a saved `predict --json` result")],
    plan_b: Annotated[Path, typer.Argument(help="job file (YAML/JSON) or a saved `predict --json` result")],
    engine: Annotated[str, typer.Option(help="estimator for job files: " + ", ".join(ENGINES.names()))
                      ] = "analytical",
    costs: Annotated[str, typer.Option(help="op costs: " + " | ".join(COSTS.names()))] = "roofline",
    db: Annotated[Path | None, typer.Option(help="profile database for --costs profiled")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    html: Annotated[Path | None, typer.Option(help="write a self-contained HTML report: A and B term by term "
                                              "(needs the report extra: plotly)")] = None,
) -> None:
    """Which of two plans is faster and why: each part of the iteration time and of the peak memory, A -> B."""
    for path in (plan_a, plan_b):
        if not path.is_file():
            raise ConfigError("plan", str(path), "no such file: name a job file or a predict --json result")
    if html is not None:
        check_output_file(html, "html")  # before any work
        require_plotly()
    found = api.compare(plan_a, plan_b, engine=engine, costs=costs, db=db)
    typer.echo(found.to_json() if as_json else "\n".join(found.explanation))
    if html is not None:
        found.write_html(html)
        typer.echo(f"report: {html} (open it in a browser; it needs no network)", err=True)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
