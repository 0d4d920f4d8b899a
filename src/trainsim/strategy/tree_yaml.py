"""The YAML form of a StrategyTree: load it (strict keys, one-line errors) and dump it back.

    strategy_tree:
      schedule: {micro_batches: 8, kind: 1f1b}        # the root's; or a list of {path: ..., ...}
      map:
        - {path: "blocks.0-9", stage: 0}
        - {path: "blocks.10-23", stage: 1, tp: 2}
      recompute:
        - {path: "blocks.*", mode: selective}
      split:
        - {path: "blocks.*.attn", item: weight, dim: heads, parts: 2}
        - {path: "blocks.*.attn.qkv", item: compute, dim: out, parts: 2, axis: tp}   # axis: dp unless given

Sections apply in the order schedule, map, recompute, split, entries in file order; a path is a pattern as
StrategyTree.match reads it, and a missing path is the root.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trainsim.catalog.files import read_mapping
from trainsim.errors import ConfigError, unknown_key
from trainsim.ir.graph import OpGraph
from trainsim.specbase import Spec
from trainsim.strategy.parallel import Recompute
from trainsim.strategy.tree import (
    MESH_KEYS,
    SCHEDULE_KEYS,
    Mesh,
    ScheduleConfig,
    Split,
    StrategyTree,
    Value,
)

SECTIONS = ("schedule", "map", "recompute", "split")


class _ScheduleEntry(ScheduleConfig):
    path: str = ""


class _MapEntry(Mesh):
    path: str = ""


class _RecomputeEntry(Spec):
    path: str = ""
    mode: Recompute


class _SplitEntry(Split):
    path: str = ""


def load_tree_yaml(path: str | Path, graph: OpGraph) -> StrategyTree:
    """Read a strategy-tree file (YAML or JSON) whose one top-level key is strategy_tree."""
    data = read_mapping(Path(path))
    for key in data:
        if key != "strategy_tree":
            raise unknown_key(str(key), "a strategy-tree file holds one key, strategy_tree")
    if "strategy_tree" not in data:
        raise ConfigError("strategy_tree", None, f"missing: {path} holds no strategy_tree mapping")
    return tree_from_mapping(data["strategy_tree"], graph)


def tree_from_mapping(data: object, graph: OpGraph, where: str = "strategy_tree") -> StrategyTree:
    """Build a tree from the mapping under strategy_tree (for job files that embed one)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping with keys " + ", ".join(SECTIONS))
    for key in data:
        if key not in SECTIONS:
            raise unknown_key(f"{where}.{key}", "allowed: " + ", ".join(SECTIONS))
    tree = StrategyTree.from_graph(graph)
    for section in SECTIONS:
        for label, entry in _entries(data.get(section), f"{where}.{section}", single=section == "schedule"):
            tree = _APPLY[section](tree, entry, label)
    return tree


def tree_to_mapping(tree: StrategyTree) -> dict[str, Any]:
    """The tree's explicit settings in the YAML form (runs of numbered siblings written as ranges), so that
    tree_from_mapping(tree_to_mapping(tree)["strategy_tree"], graph) == tree."""
    order = {path: index for index, path in enumerate(tree.preorder())}
    sections: dict[str, list[tuple[str, dict[str, Value]]]] = {section: [] for section in SECTIONS}
    for path in sorted(tree.explicit, key=order.__getitem__):
        row = tree.explicit[path]
        schedule = {key: row[key] for key in SCHEDULE_KEYS if key in row}
        mesh = {key: row[key] for key in MESH_KEYS if key in row}
        if schedule:
            sections["schedule"].append((path, schedule))
        if mesh:
            sections["map"].append((path, mesh))
        if "recompute" in row:
            sections["recompute"].append((path, {"mode": row["recompute"]}))
        for key in sorted(key for key in row if key.startswith("split.")):
            split = Split.of_key(key, row[key])
            payload: dict[str, Value] = {"item": split.item, "dim": split.dim, "parts": split.parts}
            sections["split"].append((path, payload if split.axis == "dp" else {**payload, "axis": split.axis}))
    out: dict[str, Any] = {}
    for section, entries in sections.items():
        if section == "schedule" and len(entries) == 1 and entries[0][0] == "":
            out[section] = dict(entries[0][1])
        elif entries:
            out[section] = [{"path": path, **payload} for path, payload in _as_ranges(entries)]
    return {"strategy_tree": out}


def dump_tree_yaml(tree: StrategyTree) -> str:
    return yaml.safe_dump(tree_to_mapping(tree), sort_keys=False, default_flow_style=None, width=120)


def _entries(value: object, where: str, single: bool) -> list[tuple[str, dict[str, Any]]]:
    if value is None:
        return []
    if single and isinstance(value, dict):
        return [(where, value)]
    if not isinstance(value, list):
        shape = "a mapping or a list of mappings" if single else "a list of mappings"
        raise ConfigError(where, value, f"must be {shape}")
    out = []
    for index, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}[{index}]", entry, "must be a mapping such as {path: blocks.*, ...}")
        out.append((f"{where}[{index}]", entry))
    return out


def _apply_schedule(tree: StrategyTree, entry: dict[str, Any], where: str) -> StrategyTree:
    spec = _ScheduleEntry.parse(entry, where)
    return tree.schedule(spec.path, spec.micro_batches, spec.max_in_flight, spec.kind, where=where)


def _apply_map(tree: StrategyTree, entry: dict[str, Any], where: str) -> StrategyTree:
    spec = _MapEntry.parse(entry, where)
    return tree.map(spec.path, Mesh.model_validate(spec.model_dump(exclude={"path"})), where=where)


def _apply_recompute(tree: StrategyTree, entry: dict[str, Any], where: str) -> StrategyTree:
    spec = _RecomputeEntry.parse(entry, where)
    return tree.recompute(spec.path, spec.mode, where=where)


def _apply_split(tree: StrategyTree, entry: dict[str, Any], where: str) -> StrategyTree:
    spec = _SplitEntry.parse(entry, where)
    return tree.split(spec.path, spec.item, spec.dim, spec.parts, axis=spec.axis, where=where)


_APPLY: dict[str, Callable[[StrategyTree, dict[str, Any], str], StrategyTree]] = {
    "schedule": _apply_schedule, "map": _apply_map, "recompute": _apply_recompute, "split": _apply_split}


def _as_ranges(entries: list[tuple[str, dict[str, Value]]]) -> list[tuple[str, dict[str, Value]]]:
    """Merge entries with equal payloads whose paths differ only in their last numeric segment into ranges:
    blocks.0.attn .. blocks.23.attn -> blocks.0-23.attn. Order: first appearance."""
    numbers: dict[tuple[str, str, str], list[int]] = {}
    payloads: dict[tuple[str, str, str], dict[str, Value]] = {}
    for path, payload in entries:
        head, number, tail = _around_last_number(path)
        key = (head, tail, repr(sorted(payload.items())))
        payloads.setdefault(key, payload)
        numbers.setdefault(key, [])
        if number is not None:
            numbers[key].append(number)
    out: list[tuple[str, dict[str, Value]]] = []
    for (head, tail, _), payload in payloads.items():
        found = numbers[(head, tail, _)]
        out += [(f"{head}{run}{tail}", payload) for run in _runs(sorted(found))] if found else [(head, payload)]
    return out


def _around_last_number(path: str) -> tuple[str, int | None, str]:
    """("blocks.", 3, ".attn") for blocks.3.attn; (path, None, "") without a numeric segment."""
    parts = path.split(".")
    numeric = [i for i, part in enumerate(parts) if part.isdigit()]
    if not numeric:
        return path, None, ""
    at = numeric[-1]
    head = ".".join(parts[:at]) + ("." if at else "")
    tail = ("." if at + 1 < len(parts) else "") + ".".join(parts[at + 1:])
    return head, int(parts[at]), tail


def _runs(numbers: list[int]) -> list[str]:
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
