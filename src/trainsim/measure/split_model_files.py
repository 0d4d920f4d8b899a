"""Files of the split executor read without torch (the CLI checks them before any rank starts)."""

import json
from pathlib import Path


def dataflow_beside(model_path: str) -> dict[str, list[str]] | None:
    """A CNN's dataflow file <model>.inputs.json beside its YAML (scripts/gen_proteus_small.py), if any."""
    path = Path(model_path)
    sidecar = path.with_name(path.stem + ".inputs.json")
    if path.suffix not in (".yaml", ".yml") or not sidecar.exists():
        return None
    data = json.loads(sidecar.read_text())
    return {str(k): [str(x) for x in v] for k, v in data.items()}
