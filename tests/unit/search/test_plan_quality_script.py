"""scripts/plan_quality.py's pieces on tiny hand-made files: a plan's label and `trainsim measure` flags, plans two
planners share run once, and the summary's medians and gaps (no timing run)."""

import csv
import json
from pathlib import Path
from types import ModuleType

import pytest

from conftest import module_from_file

ROOT = Path(__file__).resolve().parents[3]


def _script() -> ModuleType:
    module = module_from_file("scripts/plan_quality.py")
    return module


def _report(stages: list[tuple[int, int, str, int]], layers: list[int], dp: int, predicted_s: float) -> dict:
    return {"plan": {"iteration_s": predicted_s, "stages": [{"units": [a, b], "mesh": m, "dp": d}
                                                             for a, b, m, d in stages]},
            "parallel": {"tp": 1, "dp": dp, "pp": len(stages), "sp": False, "micro_batch": 4 // dp,
                         "global_batch": 32, "seq_len": 64, "precision": "fp32", "schedule": "1f1b",
                         "stage_layers": layers},
            "sim_iteration_s": None, "profiled_configurations": 7, "stage_evaluations": 9}


UNEVEN = _report([(0, 7, "1x2", 2), (7, 10, "1x2", 2)], [6, 2], 2, 0.4)
EVEN = _report([(0, 10, "1x4", 4)], [], 4, 0.5)


def test_plan_label_and_measure_flags() -> None:
    script = _script()
    assert script.plan_label(UNEVEN) == "0-7@1x2dp2+7-10@1x2dp2"
    assert script.measure_flags(UNEVEN["parallel"]) == [
        "--tp", "1", "--pp", "2", "--dp", "2", "--micro-batch", "2", "--global-batch", "32", "--seq-len", "64",
        "--precision", "fp32", "--schedule", "1f1b", "--stage-layers", "6,2"]
    assert "--stage-layers" not in script.measure_flags(EVEN["parallel"])  # an even split needs none


def _write(out: Path, planners: dict[str, dict], rows: list[tuple[str, int, float, float]]) -> None:
    for name, report in planners.items():
        record = {"planner": name, "wall_s": 10.0, "cpu_s": 5.0, "load1_before": 1.0, "load1_after": 2.0,
                  "report": report}
        (out / f"search-{name}.json").write_text(json.dumps(record))
    with (out / "measured.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["plan", "repeat", "median_s", "rank_cpu_max_s", "load1_before",
                                                    "load1_after"])
        writer.writeheader()
        for plan, repeat, wall, cpu in rows:
            writer.writerow({"plan": plan, "repeat": repeat, "median_s": wall, "rank_cpu_max_s": cpu,
                             "load1_before": 3.0, "load1_after": 4.0 + repeat})


def test_summary_medians_and_gaps(tmp_path: Path) -> None:
    script = _script()
    uneven, even = script.plan_label(UNEVEN), script.plan_label(EVEN)
    _write(tmp_path, {"exhaustive": UNEVEN, "mpe": UNEVEN, "uniform": EVEN},
           [(uneven, 0, 1.0, 0.3), (even, 0, 1.3, 0.5), (uneven, 1, 1.2, 0.4), (even, 1, 1.1, 0.6),
            (uneven, 2, 0.9, 0.35), (even, 2, 1.2, 0.4)])
    # two planners chose the same plan: it is run once per repeat
    assert list(script.distinct_plans(script.searched(tmp_path))) == [uneven, even]
    table = {row["planner"]: row for row in script.summary(tmp_path, script.MODELS["gpt"])["table"]}
    assert table["mpe"]["exhaustive_table_s"] is None  # no exhaustive stage table in this folder
    assert table["exhaustive"]["measured_median_s"] == 1.0 and table["exhaustive"]["gap_to_exhaustive"] == 0.0
    assert table["mpe"]["measured_median_s"] == 1.0 and table["mpe"]["repeats"] == 3
    assert table["uniform"]["measured_median_s"] == 1.2
    assert table["uniform"]["gap_to_exhaustive"] == pytest.approx(0.2)
    assert table["uniform"]["busiest_rank_cpu_s"] == 0.5
    assert table["uniform"]["cpu_gap_to_exhaustive"] == pytest.approx(0.5 / 0.35 - 1.0)
    assert json.loads((tmp_path / "summary.json").read_text())["measure_load1_range"] == [3.0, 6.0]


def test_a_plan_of_mixed_meshes_is_refused(tmp_path: Path) -> None:
    script = _script()
    mixed = dict(UNEVEN, parallel=None)
    _write(tmp_path, {"exhaustive": mixed}, [])
    with pytest.raises(SystemExit, match="not one ParallelSpec"):
        script.distinct_plans(script.searched(tmp_path))


def test_references_are_the_exhaustive_tables_best_plan_per_mesh(tmp_path: Path) -> None:
    # the repo's CPU stage database (every stage of gpt-heavy-head on 1, 2 and 4 ranks) as the exhaustive one
    import shutil

    from trainsim.catalog import load_model
    from trainsim.measure.stage_db import StageDatabase, model_key
    from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec, pipeline_time_s

    script = _script()
    (tmp_path / "stages").mkdir()
    shutil.copy(ROOT / "data/stages/cpu/stages_cpu.db", tmp_path / "stages" / "exhaustive.sqlite")
    script.references(tmp_path, script.MODELS["gpt"])  # asserts that nothing was measured
    records = script.searched(tmp_path)
    assert list(records) == ["reference-1x1-tp1-dp1", "reference-1x2-tp1-dp2", "reference-1x4-tp1-dp4"]
    two = records["reference-1x2-tp1-dp2"]["report"]
    assert script.plan_label(two) == "0-7@1x2dp2+7-10@1x2dp2"  # docs/planning.md's exhaustive plan
    assert two["parallel"]["stage_layers"] == [6, 2] and two["parallel"]["micro_batch"] == 2
    db = StageDatabase(tmp_path / "stages" / "exhaustive.sqlite")
    key = model_key(load_model(str(script.MODELS["gpt"])))  # type: ignore[arg-type]
    latencies = [db.get(key, 4, 64, 1, StageSpec(a, b, Mesh(1, 2), IntraPlan(1, 2))) for a, b in ((0, 7), (7, 10))]
    db.close()
    assert None not in latencies
    assert two["plan"]["iteration_s"] == pytest.approx(pipeline_time_s([e.latency_s for e in latencies if e], 8))
    assert records["reference-1x4-tp1-dp4"]["report"]["parallel"]["pp"] == 1
    assert records["reference-1x1-tp1-dp1"]["report"]["parallel"]["pp"] == 4


def test_every_stage_variants_search_with_alpa_full_profiling() -> None:
    script = _script()
    db = ROOT / "stages.sqlite"
    full = script.search_command("exhaustive-every", ROOT / "m.yaml", db)
    assert full[-1] == "--every-stage" and "measured" in full
    assert "--every-stage" not in script.search_command("exhaustive", ROOT / "m.yaml", db)
    assert script.search_command("predtop-every", ROOT / "m.yaml", db)[-1] == "--every-stage"
    assert script.DEFAULT_PLANNERS == ["exhaustive", "predtop", "mpe", "uniform"]
