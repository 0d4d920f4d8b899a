"""The norms, residual adds, final norm and positions split by hidden features over tp (measure/feature_splits.py)
run for real on 2 gloo ranks: the loss and every parameter's gradient equal the unsplit model's (tp_gradients: a
gradient comparison, not a loss after AdamW steps); the layouts handed to the ranks; what stays refused is one
line."""

from pathlib import Path

import pytest

from conftest import REPO_DIR, TINY_GPT_MODEL_YAML
from tp_gradients import compare_gradients

MEGATRON = REPO_DIR / "data" / "strategies" / "megatron"


@pytest.mark.parametrize("name", ["gpt-tp2-norms-features", "gpt-tp2-adds-features"])
def test_a_split_by_features_computes_the_unsplit_gradients(tmp_path: Path, name: str) -> None:
    pytest.importorskip("torch")
    compare_gradients(TINY_GPT_MODEL_YAML, (MEGATRON / f"{name}.yaml").read_text(), tmp_path)
