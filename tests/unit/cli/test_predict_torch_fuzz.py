"""`trainsim predict --frontend torch --model FILE.py:build` on hypothesis-drawn small nn.Module factories: stacks of
Conv2d / MaxPool2d / BatchNorm / ReLU / Flatten / Linear with varying shapes, some with a repeated block (a
ModuleList or Sequential of identical blocks, which may pool or stride), some with a deliberate shape mistake.
The oracle is the same module run for real on zeros (forward and backward): where that runs, predict exits 0
with finite, in-range figures, its FLOPs at least the GEMM and convolution FLOPs torch's FlopCounterMode counts
on the real step and its weights the real parameters' bytes; where it raises, predict refuses in one line with
exit code 2 (no traceback)."""

import json
import math
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from trainsim.cli.main import app

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

MB = 2
RUNNER = CliRunner()
PREDICT = ["predict", "--frontend", "torch", "--cluster", "local-cpu", "--num-gpus", "1", "--tp", "1",
           "--precision", "fp32", "--micro-batch", str(MB), "--global-batch", str(MB), "--json"]
NAMES = count()

# The factory file predict loads: it rebuilds the drawn stack from its JSON description.
FACTORY = '''
import torch
from torch import nn
from trainsim.frontends.torch.capture import TensorSpec

SPEC = {spec!r}


def layer(item):
    kind, args = item[0], item[1:]
    if kind == "repeat":
        blocks = [nn.Sequential(*(layer(part) for part in args[2])) for _ in range(args[0])]
        return nn.ModuleList(blocks) if args[1] == "list" else nn.Sequential(*blocks)
    return {{"conv": nn.Conv2d, "pool": nn.MaxPool2d, "bn2d": nn.BatchNorm2d, "bn1d": nn.BatchNorm1d,
             "linear": nn.Linear, "relu": nn.ReLU, "flatten": nn.Flatten}}[kind](*args)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(layer(item) for item in SPEC["layers"])

    def forward(self, x):
        for one in self.layers:
            if isinstance(one, nn.ModuleList):
                for block in one:
                    x = block(x)
            else:
                x = one(x)
        return x


def build(micro_batch=2):
    return Stack(), {{"x": TensorSpec((micro_batch, *SPEC["input"]), "float32")}}
'''


@st.composite
def _stacks(draw: st.DrawFn) -> dict[str, Any]:
    """A stack over a tracked shape; each size is usually the one that fits and sometimes one that does not."""
    image = draw(st.booleans())
    shape = [draw(st.integers(1, 4)), draw(st.integers(2, 12)), draw(st.integers(2, 12))] if image else [
        draw(st.integers(1, 24))]
    start, layers = list(shape), []

    def fitting(value: int) -> int:
        return value + 1 if draw(st.integers(0, 7)) == 0 else value

    for _ in range(draw(st.integers(1, 4))):
        if len(shape) == 3:
            kind = draw(st.sampled_from(["conv", "conv", "pool", "bn2d", "relu", "repeat", "flatten"]))
        else:
            kind = draw(st.sampled_from(["linear", "linear", "bn1d", "relu", "repeat"]))
        if kind == "conv":
            out, k, stride = draw(st.integers(1, 8)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
            layers.append(["conv", fitting(shape[0]), out, k, stride, k // 2])
            shape = [out, *((size + 2 * (k // 2) - k) // stride + 1 for size in shape[1:])]
        elif kind == "pool":
            layers.append(["pool", 2])
            shape = [shape[0], shape[1] // 2, shape[2] // 2]
        elif kind in ("bn2d", "bn1d"):
            layers.append([kind, fitting(shape[0])])
        elif kind == "relu":
            layers.append(["relu"])
        elif kind == "flatten":
            layers.append(["flatten"])
            shape = [math.prod(shape)]
        elif kind == "linear":
            out = draw(st.integers(1, 24))
            layers.append(["linear", fitting(shape[0]), out])
            shape = [out]
        else:
            depth, container = draw(st.integers(2, 4)), draw(st.sampled_from(["list", "seq"]))
            if len(shape) == 3:
                shrink = draw(st.sampled_from(["none", "pool", "stride"]))
                body = [["conv", shape[0], shape[0], 3, 2 if shrink == "stride" else 1, 1], ["bn2d", shape[0]],
                        ["relu"]] + ([["pool", 2]] if shrink == "pool" else [])
                for _ in range(depth if shrink != "none" else 0):
                    shape = [shape[0], *((size // 2 if shrink == "pool" else (size - 1) // 2 + 1)
                                         for size in shape[1:])]
            else:
                body = [["linear", shape[0], shape[0]], ["bn1d", shape[0]], ["relu"]]
            layers.append(["repeat", depth, container, body])
    return {"input": start, "layers": layers}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stacks")


def _factory(folder: Path, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    path = folder / f"stack_{next(NAMES)}.py"  # a new name each: predict imports it as a new module
    path.write_text(FACTORY.format(spec=spec))
    scope: dict[str, Any] = {}
    exec(compile(path.read_text(), str(path), "exec"), scope)  # the same module, built for real
    return f"{path}:build", scope


def _real_step(scope: dict[str, Any], spec: dict[str, Any]) -> tuple[float, int] | None:
    """The real step's GEMM and convolution FLOPs and parameter count; None where the module raises."""
    try:
        module = scope["Stack"]().train()
        with FlopCounterMode(display=False) as counter:
            module(torch.zeros(MB, *spec["input"])).sum().backward()
    except (RuntimeError, ValueError, IndexError):
        return None
    return float(counter.get_total_flops()), sum(p.numel() for p in module.parameters())


# both branches every run, whatever the draws: a stack that fits (conv 3 -> 4 keeps 8 x 8, 4 x 64 = 256 features),
# one whose conv expects 4 input channels of a 3-channel image, and strided repeated blocks (8 -> 4 -> 2)
FITS = {"input": [3, 8, 8], "layers": [["conv", 3, 4, 3, 1, 1], ["relu"], ["flatten"], ["linear", 256, 10]]}
MISFITS = {"input": [3, 8, 8], "layers": [["conv", 4, 4, 3, 1, 1], ["relu"]]}
REPEATS = {"input": [2, 8, 8], "layers": [["repeat", 2, "list", [["conv", 2, 2, 3, 2, 1], ["bn2d", 2], ["relu"]]],
                                          ["flatten"], ["linear", 8, 3]]}


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_stacks())
@example(FITS)
@example(MISFITS)
@example(REPEATS)
def test_predict_on_drawn_stacks_is_in_range_or_one_line(folder: Path, spec: dict[str, Any]) -> None:
    target, scope = _factory(folder, spec)
    real = _real_step(scope, spec)
    result = RUNNER.invoke(app, [*PREDICT, "--model", target])
    repeats = [item for item in spec["layers"] if item[0] == "repeat"]
    event(("refused" if real is None else "predicted") + (" with repeated blocks" if repeats else ""))
    if spec in (FITS, MISFITS, REPEATS):  # the fixed examples: the real step runs but on the misfit
        assert (real is None) == (spec == MISFITS), spec
    if real is None:
        assert result.exit_code == 2, (spec, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output, result.output
        return
    assert result.exit_code == 0, (spec, result.output)
    run = json.loads(result.stdout)
    real_flops, real_params = real
    assert math.isfinite(run["iteration_time_s"]) and run["iteration_time_s"] > 0.0
    assert 0.0 < run["mfu"] <= 1.0 and 0.0 < run["peak_memory_bytes"] <= run["memory_capacity_bytes"]
    assert run["model_flops_per_iteration"] >= real_flops
    assert run["memory_breakdown"]["weights"] == 4 * real_params  # fp32 weights, every parameter once
    if spec == FITS:  # by hand: the conv's 3 x 4 x 3 x 3 weights and 4 biases, the linear's 256 x 10 and 10
        assert run["memory_breakdown"]["weights"] == 4 * (3 * 4 * 9 + 4 + 256 * 10 + 10)
