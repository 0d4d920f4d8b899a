"""The packages of trainsim import each other only downward, in the order README.md's "How it works" gives.

LAYERS lists the packages bottom-up; a package may import its own layer and the layers below it, never one
above. The test reads every module's imports (top-level and deferred alike, with ast), so a deferred import
cannot hide an upward edge, and it fails on any import cycle between packages.
"""

import ast
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "trainsim"

# Bottom-up. Modules at the package root (errors.py, units.py, ...) count as packages of their own name.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("version",),  # the version string
    ("errors",),
    ("units", "registry", "specbase", "collector", "divisors"),
    ("hardware",),
    ("ir",),
    ("catalog",),
    ("strategy",),
    ("embedding",),
    ("job",),
    ("frontends",),
    ("jobfile",),
    ("measure",),
    ("profile",),
    ("comm",),
    ("cost",),
    ("compile",),
    ("sim",),
    ("estimate",),
    ("pipeline",),
    ("search",),
    ("validate",),
    ("calibrate",),
    ("report",),
    ("api",),  # the Python API: what the commands are thin layers over
    ("cli",),
    ("__main__",),
    ("__init__",),  # the package root: the API's front door (its names load on first use)
)
RANK = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _submodule(name: str) -> str:
    """`from trainsim import name`: a subpackage or module, or else a name the package root defines."""
    return f"trainsim.{name}" if (SRC / name).is_dir() or (SRC / f"{name}.py").exists() else "trainsim"


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the places (file:line) that import across them."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        module = "trainsim." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        source = _package(module if path.name != "__init__.py" or path.parent != SRC else "trainsim")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names: list[str] = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] if node.module != "trainsim" else [_submodule(a.name) for a in node.names]
            for name in names:
                if name != "trainsim" and not name.startswith("trainsim."):
                    continue
                target = _package(name)
                if target != source:
                    edges[(source, target)].append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    return edges


def test_every_package_has_a_layer() -> None:
    packages = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
                if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert packages - set(RANK) == set(), "add the new package to LAYERS (and to README.md's package map)"


def test_no_relative_imports() -> None:
    relative = [f"{p.relative_to(SRC.parent)}:{n.lineno}" for p in SRC.rglob("*.py")
                for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert relative == []


def test_imports_point_down() -> None:
    upward = {f"{a} -> {b}": places for (a, b), places in import_edges().items() if RANK[a] < RANK[b]}
    assert upward == {}


def test_no_package_cycle() -> None:
    graph = nx.DiGraph(list(import_edges()))
    assert list(nx.simple_cycles(graph)) == []


@pytest.mark.parametrize("package", ["compile", "estimate"])
def test_named_rules(package: str) -> None:
    """The two rules shared/DESIGN.md states by name: the compiler never asks an engine for prices, and no
    engine builds its own graph from a front-end."""
    forbidden = {"compile": "estimate", "estimate": "frontends"}[package]
    assert (package, forbidden) not in import_edges()
