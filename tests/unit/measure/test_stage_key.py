"""measure.stage_db.model_key: the model's name and a hash of its spec, DeepSeek's layout hashed only where the
model uses it (stage databases recorded before the spec had those fields keep matching their models)."""

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import yaml

from trainsim.catalog import load_model
from trainsim.catalog.model_files import parse_model
from trainsim.ir.model_spec import DEEPSEEK_LAYOUT_FIELDS, TransformerSpec
from trainsim.measure.stage_db import model_key


def _hash(spec: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _transformer(name: str) -> TransformerSpec:
    model = load_model(name)
    assert isinstance(model, TransformerSpec)
    return model


def test_a_model_without_the_layout_is_hashed_without_its_fields() -> None:
    gpt = _transformer("gpt3-125m")
    dumped = gpt.model_dump()
    assert all(not dumped[name] for name in DEEPSEEK_LAYOUT_FIELDS)
    kept = {name: value for name, value in dumped.items() if name not in DEEPSEEK_LAYOUT_FIELDS}
    assert model_key(gpt) == f"gpt3-125m:{_hash(kept)}"


def test_a_model_with_the_layout_is_hashed_whole() -> None:
    deepseek = _transformer("deepseek-v3")
    dumped = deepseek.model_dump()
    assert all(dumped[name] for name in DEEPSEEK_LAYOUT_FIELDS)
    assert model_key(deepseek) == f"deepseek-v3:{_hash(dumped)}"
    plain = deepseek.model_copy(update={"mla": None})
    assert model_key(plain) == f"deepseek-v3:{_hash({k: v for k, v in dumped.items() if k != 'mla'})}"


def test_the_shipped_stage_databases_keep_matching_their_models() -> None:
    """The keys recorded in data/stages' databases (before the spec had DeepSeek's layout) are the keys of
    data/stages/models' files today: their measured rows are still found."""
    root = Path(__file__).resolve().parents[3] / "data" / "stages"
    recorded: set[str] = set()
    for database in sorted(root.rglob("*.db")):
        with closing(sqlite3.connect(database)) as connection:
            recorded |= {key for (key,) in connection.execute("SELECT DISTINCT model FROM stage_times")}
    assert len(recorded) >= 5  # gpt-gpu, moe-gpu (H100); gpt-heavy-head, moe-small, gpt-deep (CPU)
    for key in sorted(recorded):
        name = key.split(":")[0]
        model = parse_model(yaml.safe_load((root / "models" / f"{name}.yaml").read_text()))
        assert isinstance(model, TransformerSpec)
        assert model_key(model) == key
