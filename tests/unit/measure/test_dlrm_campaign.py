"""measure.dlrm_campaign: the tasks, the validated campaign, resumable and atomic files, the configs measured per
group (with measure.dlrm stubbed: no rank starts here), and `trainsim measure --generated/--dlrm-tasks`'s
one-line refusals."""

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app
from trainsim.errors import ConfigError, TrainsimError
from trainsim.measure import dlrm_campaign
from trainsim.measure.dlrm import DlrmConfig, DlrmMeasurement
from trainsim.measure.dlrm_campaign import (
    Campaign,
    CampaignFiles,
    CampaignTask,
    generated_tasks,
    parse_int_list,
    read_task_file,
    run_campaign,
    sharders_from,
)

runner = CliRunner()


def test_generated_tasks_alternate_heavy_and_normal_seeds() -> None:
    assert generated_tasks(5) == [CampaignTask("heavy", 0), CampaignTask("normal", 100), CampaignTask("heavy", 1),
                                  CampaignTask("normal", 101), CampaignTask("heavy", 2)]
    assert generated_tasks(2, "heavy") == [CampaignTask("heavy", 0), CampaignTask("heavy", 1)]
    assert generated_tasks(1, "normal") == [CampaignTask("normal", 100)]
    model, tables = CampaignTask("normal", 100).model(2)
    assert model.name == "normal100-r2" and len(model.tables) == len(tables) > 0


def test_task_file_lists_kind_and_seed(tmp_path: Path) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text("tasks:\n  - {kind: heavy, seed: 3}\n  - {kind: normal, seed: 7}\n")
    assert read_task_file(path) == [CampaignTask("heavy", 3), CampaignTask("normal", 7)]
    for text, message in (("tasks: []\n", "tasks"), ("tasks:\n  - {kind: big, seed: 1}\n", "task.kind"),
                          ("tasks:\n  - {kind: heavy}\n", "kind and seed"),
                          ("tasks:\n  - {kind: heavy, seed: -1}\n", "task.seed"),
                          ("tasks:\n  - {kind: heavy, seed: 1}\n  - {kind: heavy, seed: 1}\n", "twice")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            read_task_file(path)


@pytest.mark.parametrize(("changes", "message"), [
    ({"batches": ()}, "batch"), ({"batches": (0,)}, "batch"), ({"batches": (32, 32)}, "distinct"),
    ({"ranks": (1,)}, "ranks"), ({"sharders": ("best",)}, "sharder"), ({"iterations": 0}, "iterations"),
    ({"tasks": ()}, "tasks"),
])
def test_campaign_refuses_bad_settings(changes: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"tasks": (CampaignTask("heavy", 0),), **changes}
    with pytest.raises(ConfigError, match=message):
        Campaign(**settings)


def test_int_lists_and_sharders_parse_or_refuse() -> None:
    assert parse_int_list("batch", "32,128") == (32, 128)
    with pytest.raises(ConfigError, match="batch"):
        parse_int_list("batch", "32,x")
    assert sharders_from("all") == ("naive", "random", "size-greedy", "lookup-greedy", "norm-lookup-greedy",
                                    "size-lookup-greedy")
    with pytest.raises(ConfigError, match="sharder"):
        sharders_from("fastest")


def _stub_measure(calls: list[tuple[list[str], int]]) -> Any:
    """measure.dlrm.measure_dlrm stand-in: every config's iterations are 1, 2, 3 ms (median 2 ms)."""

    def fake(configs: list[DlrmConfig], **kwargs: Any) -> list[DlrmMeasurement]:
        calls.append(([c.name for c in configs], kwargs["group"]))
        return [DlrmMeasurement(c, 2e-3, (1e-3, 2e-3, 3e-3), ((("span", 0.0, 1e-3),),) * c.plan.num_ranks,
                                load_avg=(1.0, 2.0)) for c in configs]

    return fake


def test_campaign_measures_each_group_interleaved_and_resumes(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    calls: list[tuple[list[str], int]] = []
    monkeypatch.setattr(dlrm_campaign, "measure_dlrm", _stub_measure(calls))
    campaign = Campaign(tuple(generated_tasks(2)), batches=(8, 16), ranks=(2,), sharders=("naive", "size-greedy"))
    files = CampaignFiles.open(tmp_path / "c.csv", tmp_path / "c.jsonl")
    progress: list[tuple[str, int]] = []
    assert run_campaign(campaign, files, progress=lambda what, n: progress.append((what, n))) == 8
    # one group per task and ranks, its four configs interleaved (group of 4)
    assert calls == [([f"heavy0-r2/{s}/{b}" for s in ("naive", "size-greedy") for b in (8, 16)], 4),
                     ([f"normal100-r2/{s}/{b}" for s in ("naive", "size-greedy") for b in (8, 16)], 4)]
    assert [n for _, n in progress] == [4, 8]
    rows = CampaignFiles.open(tmp_path / "c.csv", tmp_path / "c.jsonl")
    assert len(rows.rows) == len(rows.trace_lines) == 8
    assert rows.rows[0]["measured_s"] == "0.002" and rows.rows[0]["fastest_s"] == "0.001"
    assert rows.rows[0]["load_before"] == "1.0" and rows.rows[0]["experiment"] == "e2e"
    # a rerun measures nothing; a wider campaign only what is new
    assert run_campaign(campaign, rows) == 0 and len(calls) == 2
    wider = Campaign(tuple(generated_tasks(2)), batches=(8, 16, 32), ranks=(2,), sharders=("naive",),
                     interleave=False)
    assert run_campaign(wider, rows) == 2
    assert calls[2:] == [(["heavy0-r2/naive/32"], 1), (["normal100-r2/naive/32"], 1)]
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic writes left no temporary file


def test_rows_record_the_hosts_usable_cores_and_old_rows_keep_theirs_blank(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    calls: list[tuple[list[str], int]] = []
    monkeypatch.setattr(dlrm_campaign, "measure_dlrm", _stub_measure(calls))
    monkeypatch.setattr(dlrm_campaign, "usable_cores", lambda: 3)
    csv_path = tmp_path / "c.csv"
    # a campaign CSV written before the column existed (its old header, one row)
    old_fields = [f for f in dlrm_campaign.FIELDS if f != "cores"]
    csv_path.write_text(",".join(old_fields) + "\n"
                        + "e2e,2,heavy0-r2,heavy,0,28,naive,8,0.5,0.4,1.0,2.0\n")
    files = CampaignFiles.open(csv_path, tmp_path / "c.jsonl")
    campaign = Campaign(tuple(generated_tasks(1)), batches=(8, 16), ranks=(2,), sharders=("naive",))
    assert run_campaign(campaign, files) == 1  # batch 8 was there
    rows = CampaignFiles.open(csv_path, tmp_path / "c.jsonl").rows
    assert [(r["local_batch"], r["cores"]) for r in rows] == [("8", ""), ("16", "3")]


def test_a_failed_group_leaves_the_files_as_after_the_last_group(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    calls: list[tuple[list[str], int]] = []
    stub = _stub_measure(calls)

    def failing(configs: list[DlrmConfig], **kwargs: Any) -> list[DlrmMeasurement]:
        if calls:
            raise TrainsimError("DLRM measurement failed on rank 1: boom")
        return stub(configs, **kwargs)

    monkeypatch.setattr(dlrm_campaign, "measure_dlrm", failing)
    campaign = Campaign(tuple(generated_tasks(2)), batches=(8,), ranks=(2,))
    files = CampaignFiles.open(tmp_path / "c.csv", tmp_path / "c.jsonl")
    with pytest.raises(TrainsimError, match="boom"):
        run_campaign(campaign, files)
    kept = CampaignFiles.open(tmp_path / "c.csv", tmp_path / "c.jsonl")
    assert [r["task"] for r in kept.rows] == ["heavy0-r2"] and len(kept.trace_lines) == 1


def _refuse_to_measure(configs: list[DlrmConfig], **kwargs: Any) -> list[DlrmMeasurement]:
    raise AssertionError("a refused campaign measured")


@pytest.mark.parametrize(("args", "message"), [
    (["--generated", "0"], "generated"),
    (["--generated", "2", "--batch", "32,x"], "batch"),
    (["--generated", "2", "--batch", "0"], "batch"),
    (["--generated", "2", "--ranks", "1"], "ranks"),
    (["--generated", "2", "--sharder", "fastest"], "sharder"),
    (["--generated", "2", "--task-kind", "light"], "task_kind"),
    (["--generated", "2", "--dlrm-tasks", "tasks.yaml"], "not both"),
    (["--dlrm-tasks", "tasks.yaml", "--task-kind", "heavy"], "task_kind"),
    (["--generated", "2", "--model", "dlrm-mlperf-terabyte"], "--model"),
    (["--generated", "2", "--sharding", "plan.yaml"], "--sharding"),
    (["--generated", "2", "--profile"], "profile"),
    (["--generated", "2", "--iterations", "0"], "iterations"),
    (["--generated", "2", "--timeout-s", "nan"], "timeout_s"),
    (["--generated", "2", "--allocator", "jemalloc"], "keep, system"),
    (["--batch", "32"], "campaign"),
    (["--ranks", "2", "--sharder", "naive", "--model", "x.yaml"], "campaign"),
    (["--no-interleave"], "campaign"),
    (["--generated", "2", "--traced-iterations", "3"], "--execution-trace"),
    (["--generated", "2", "--execution-trace", "--traced-iterations", "0"], "traced_iterations"),
    (["--dlrm-tasks", "missing.yaml"], "missing.yaml"),
])
def test_measure_refuses_bad_campaign_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                            message: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlrm_campaign, "measure_dlrm", _refuse_to_measure)  # a refusal never starts a rank
    (tmp_path / "tasks.yaml").write_text("tasks:\n  - {kind: heavy, seed: 0}\n")
    out = runner.invoke(app, ["measure", *args, "--out", str(tmp_path / "out")])
    assert out.exit_code == 2, out.output
    assert message in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1


def test_measure_command_runs_a_campaign_and_resumes_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[list[str], int]] = []
    monkeypatch.setattr(dlrm_campaign, "measure_dlrm", _stub_measure(calls))
    args = ["measure", "--generated", "2", "--ranks", "2", "--batch", "8,16", "--sharder", "all", "--iterations",
            "3", "--warmup", "0", "--out", str(tmp_path)]
    out = runner.invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    record = json.loads(out.output)
    assert len(record["rows"]) == 2 * 6 * 2 and {r["experiment"] for r in record["rows"]} == {"sharding"}
    assert [len(names) for names, _ in calls] == [12, 12] and {group for _, group in calls} == {12}
    again = runner.invoke(app, args)  # resumed: every config is in the CSV, nothing measured; the table printed
    assert again.exit_code == 0, again.output
    assert len(calls) == 2 and "heavy0-r2" in again.output and "size-lookup-greedy" in again.output
    assert (tmp_path / "dlrm_campaign.csv").exists() and (tmp_path / "dlrm_campaign_traces.jsonl").exists()
