"""`trainsim shard`: each sharder's plan and prediction, the pick, and one-line refusals."""

import json

from typer.testing import CliRunner

from trainsim.cli.main import app
from trainsim.embedding.sharders import SHARDERS

runner = CliRunner()


def test_shard_json_lists_every_sharder_and_picks_the_fastest() -> None:
    out = runner.invoke(app, ["shard", "--synthetic", "heavy", "--seed", "2", "--num-ranks", "2",
                              "--local-batch", "32", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    times = {row["sharder"]: row["iteration_time_s"] for row in data["sharders"]}
    assert list(times) == list(SHARDERS)
    assert data["best"] == min(times, key=lambda k: (times[k], k))


def test_shard_table_on_a_catalog_dlrm() -> None:
    out = runner.invoke(app, ["shard", "--model", "dlrm-mlperf-terabyte", "--cluster", "dgx-h100-80gb",
                              "--num-ranks", "8", "--engine", "sim", "--no-plans"])
    assert out.exit_code == 0, out.output
    assert "picked:" in out.output and "size-lookup-greedy" in out.output


def test_shard_refuses_bad_input_in_one_line() -> None:
    for args in (["--synthetic", "light"], ["--synthetic", "heavy", "--engine", "replay"],
                 ["--model", "gpt3-1.3b"], [], ["--synthetic", "heavy", "--lookup", "nope.json"]):
        out = runner.invoke(app, ["shard", *args])
        assert out.exit_code == 2, (args, out.output)
        assert out.output.count("\n") == 1 and out.output.startswith("error:"), out.output
