"""scripts/plan_noise.py's plan and stage labels: the ParallelSpec fields a plan label runs with (the blocks per
stage, the micro-batch split over dp) and the stage a stage label names; bad labels refused (no timing run)."""

from pathlib import Path
from types import ModuleType

import pytest

from conftest import module_from_file
from trainsim.catalog import load_model
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec

ROOT = Path(__file__).resolve().parents[3]


def _script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # it imports plan_quality, its neighbour
    module = module_from_file("scripts/plan_noise.py")
    return module


def test_plan_label_gives_the_blocks_per_stage_and_the_micro_batch_per_dp_rank(monkeypatch):
    script = _script(monkeypatch)
    model = load_model(str(ROOT / "data/stages/models/moe-small.yaml"))  # 8 blocks: units 1-8, head unit 9
    four = script.parallel_of("0-4@1x1dp1+4-7@1x1dp1+7-9@1x1dp1+9-10@1x1dp1", model)
    assert (four["pp"], four["dp"], four["micro_batch"], four["stage_layers"]) == (4, 1, 4, [3, 3, 2, 0])
    two = script.parallel_of("0-9@1x2dp2+9-10@1x2dp2", model)
    assert (two["pp"], two["dp"], two["micro_batch"], two["stage_layers"]) == (2, 2, 2, [8, 0])
    assert script.stage_of("8-10@1x2") == StageSpec(8, 10, Mesh(1, 2), IntraPlan(1, 2))


@pytest.mark.parametrize("label", ["0-4@1x1dp1+4-10@1x2dp2", "0-4@1x1dp1+x", "0-10@1x4"])
def test_plan_labels_of_mixed_meshes_or_bad_text_are_refused(monkeypatch, label):
    script = _script(monkeypatch)
    model = load_model(str(ROOT / "data/stages/models/moe-small.yaml"))
    with pytest.raises(SystemExit, match="stages must be"):
        script.parallel_of(label, model)
