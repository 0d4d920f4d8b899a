"""Write the small versions of Proteus' six models (Table IV analogue on this machine's CPU ranks) and their S1/S2
strategy trees for 2 and 4 ranks, under data/strategies/proteus/small/.

The CNNs keep their architecture (every block of ResNet-50, VGG-19 and Inception-v3, torchvision's layer names)
with a quarter of the channels and a small input (ResNet-50 64x64, VGG-19 32x32, Inception-v3 75x75, its
smallest); the transformers and DLRM keep their layout at a few layers and narrow widths. The strategies are the
paper's (Sec. VIII-B) carved from 2 or 4 data-parallel ranks: S2 splits output channels 2 ways (CNNs), the
classifier's output and reduction dimensions (VGG-19), Megatron's attention and MLP pairs (GPT-2), the pairs with
full recomputation (GPT-1.5B) and the embedding tables' columns (DLRM). Run from the repository root:

    python scripts/gen_proteus_small.py
"""

import importlib.util
import json
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "strategies" / "proteus" / "small"
WIDTH_DIVISOR = 4
CLASSES = 100
RANKS = (2, 4)


def _catalog_generator():
    spec = importlib.util.spec_from_file_location("gen_cnn_catalog", ROOT / "scripts" / "gen_cnn_catalog.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_cnn_catalog"] = module
    spec.loader.exec_module(module)
    return module


gen = _catalog_generator()


class NarrowNet(gen.Net):
    """gen_cnn_catalog's Net with every channel count divided by WIDTH_DIVISOR (the input's 3 kept). A concat's
    width is the sum of its branches' ends, tracked here because the catalog generator passes unscaled sums."""

    def __init__(self, hw: tuple[int, int]) -> None:
        super().__init__(3, hw)
        self.branch_ends: list[int] = []
        self.branching = False
        # the dataflow the layer list leaves implicit, for the measured run (measure/split_model.py): each
        # layer's input layers ("" = the images)
        self.inputs: dict[str, list[str]] = {}
        self.end_names: list[str] = []
        self.block_start = 0  # index in rows where the current branching block's history starts
        self.pending: list[str] | None = None

    def _last(self) -> str:
        return str(self.rows[-1]["name"]) if self.rows else ""

    def _producer(self, src: tuple[int, tuple[int, int]]) -> str:
        """The earliest tensor since the block began with src's shape (the block input or a branch's middle)."""
        history = [("" if self.block_start == 0 else str(self.rows[self.block_start - 1]["name"]),
                    self.block_in)]
        history += [(str(r["name"]), (int(r["out_channels"]), tuple(r["out_hw"])))
                    for r in self.rows[self.block_start:]]
        for name, shape in history:
            if shape == (src[0], tuple(src[1])):
                return name
        return self._last()

    def _branch(self, src: object) -> None:
        if src is None:
            self.pending = None
            return
        if self.branching:
            self.branch_ends.append(self.channels)
            self.end_names.append(self._last())
        else:
            self.branching, self.branch_ends, self.end_names = True, [], []
            self.block_start, self.block_in = len(self.rows), (self.channels, tuple(self.hw))
        assert isinstance(src, tuple)
        self.pending = [self._producer(src)]

    def add(self, kind, name, block, in_c, out_c, kernel, stride, out_hw):
        self.inputs[name] = self.pending if self.pending is not None else [self._last()]
        self.pending = None
        super().add(kind, name, block, in_c, out_c, kernel, stride, out_hw)

    def conv(self, name, block, out_c, kernel, stride=1, pad=0, src=None):
        self._branch(src)
        super().conv(name, block, max(1, out_c // WIDTH_DIVISOR), kernel, stride, pad, src)

    def pool(self, name, block, kernel, stride, pad=0, src=None):
        self._branch(src)
        super().pool(name, block, kernel, stride, pad, src)

    def fc(self, name, block, in_features, out_features):
        out = CLASSES if out_features == 1000 else out_features // WIDTH_DIVISOR
        super().fc(name, block, self.channels * self.hw[0] * self.hw[1] if block != "head" else self.channels, out)

    def concat(self, name, block, out_c):
        total = sum(self.branch_ends) + self.channels
        self.pending = [*self.end_names, self._last()]
        self.branching, self.branch_ends = False, []
        super().concat(name, block, total)


def _build(builder, hw: tuple[int, int]) -> "NarrowNet":
    """Run one of gen_cnn_catalog's builders on a NarrowNet of input hw (its Net swapped in for the call)."""
    with mock.patch.object(gen, "Net", lambda channels, _hw: NarrowNet(hw)):
        net = builder()
    # gen_cnn_catalog's bottleneck compares the block's (narrowed) input with an unnarrowed width, so it adds a
    # projection shortcut to every block: keep only those that change the shape (stride or channels)
    identity = {str(r["name"]).rsplit(".", 1)[0] for r in net.rows if str(r["name"]).endswith("downsample.0")
                and r["stride"] == 1 and r["in_channels"] == r["out_channels"]}
    net.rows = [r for r in net.rows if str(r["name"]).rsplit(".", 1)[0] not in identity]
    _resnet_dataflow(net)
    return net


def _resnet_dataflow(net: "NarrowNet") -> None:
    """A bottleneck's shortcut reads the block's input, and relu3 adds the shortcut to bn3 (the residual add the
    layer list leaves out)."""
    names = [str(r["name"]) for r in net.rows]
    for name in names:
        block = name.rsplit(".", 1)[0]
        if not name.endswith(".relu3"):
            continue
        first = names.index(f"{block}.conv1")
        block_in = names[first - 1]
        shortcut = f"{block}.downsample.1" if f"{block}.downsample.1" in names else block_in
        net.inputs[name] = [f"{block}.bn3", shortcut]
        if f"{block}.downsample.0" in names:
            net.inputs[f"{block}.downsample.0"] = [block_in]
    net.inputs = {k: v for k, v in net.inputs.items() if k in names}


def _cnn_yaml(name: str, description: str, net: "NarrowNet") -> str:
    lines = ["# Generated by scripts/gen_proteus_small.py (a small version for the Table IV analogue).",
             "kind: cnn", f"name: {name}", f"description: \"{description}\"",
             f"input_hw: [{net.input_hw[0]}, {net.input_hw[1]}]", "layers:"]
    lines += [gen._row(row).replace("      - ", "  - ", 1) for row in net.rows]
    return "\n".join(lines) + "\n"


TRANSFORMERS = {
    "gpt2-small": ("GPT-2 layout, 4 layers of 256", dict(num_layers=4, hidden=256, num_heads=4, ffn_hidden=1024)),
    "gpt2-1.5b-small": ("GPT-2 1.5B layout, 8 layers of 384", dict(num_layers=8, hidden=384, num_heads=6,
                                                                    ffn_hidden=1536)),
}


def _transformer_yaml(name: str, description: str, dims: dict[str, int]) -> str:
    body = "\n".join(f"{k}: {v}" for k, v in dims.items())
    return ("# Generated by scripts/gen_proteus_small.py (a small version for the Table IV analogue).\n"
            f"kind: transformer\nname: {name}\ndescription: \"{description}\"\narch: gpt\nmlp: gelu\n"
            "norm: layernorm\nposition: learned\nbias: true\ntied_embeddings: true\nvocab: 4096\n"
            f"max_seq_len: 128\n{body}\n")


DLRM_YAML = """\
# Generated by scripts/gen_proteus_small.py (a small version for the Table IV analogue): DLRM's layout
# (Naumov et al. 2019) with 8 tables of 20,000 rows, dimension 16.
kind: dlrm
name: dlrm-small
description: "DLRM layout: 13 dense features, 8 tables of 20k x 16, dot interaction"
dense_features: 13
bottom_mlp: [64, 32, 16]
top_mlp: [64, 32, 1]
tables:
  - {rows: 20000, dim: 16, count: 8}
"""


def _trees(ranks: int) -> dict[str, str]:
    """S1 and S2 of each model on `ranks` data-parallel ranks (the paper's, Sec. VIII-B, carved 2 ways)."""
    one = "strategy_tree:\n  schedule: {micro_batches: 1}\n"
    pairs = "".join(
        f"    - {{path: \"blocks.*.{path}\", item: compute, dim: {dim}, parts: {ranks if dim == 'batch' else 2}}}\n"
        for path, dim in (("attn.qkv", "out"), ("attn.out", "reduce"), ("residual1", "batch"),
                          ("mlp.fc1", "out"), ("mlp.fc2", "reduce"), ("residual2", "batch")))
    return {
        "resnet50-small-s1": one, "inception-v3-small-s1": one, "vgg19-small-s1": one, "gpt2-small-s1": one,
        "dlrm-small-s1": one,
        "gpt2-1.5b-small-s1": one + "  recompute:\n    - {path: \"blocks.*\", mode: full}\n",
        "resnet50-small-s2": one + "  split:\n    - {path: \"layer4.*\", item: compute, dim: out, parts: 2}\n"
        "    - {path: \"head.fc\", item: compute, dim: out, parts: 2}\n"
        f"    - {{path: \"head.loss\", item: compute, dim: batch, parts: {ranks}}}\n",
        "inception-v3-small-s2": one + "  split:\n    - {path: \"Mixed_7*\", item: compute, dim: out, parts: 2}\n"
        "    - {path: \"head.fc\", item: compute, dim: out, parts: 2}\n"
        f"    - {{path: \"head.loss\", item: compute, dim: batch, parts: {ranks}}}\n",
        "vgg19-small-s2": one + "  split:\n"
        f"    - {{path: \"classifier.0\", item: compute, dim: out, parts: {ranks}}}\n"
        f"    - {{path: \"classifier.3\", item: compute, dim: reduce, parts: {ranks}}}\n"
        f"    - {{path: \"classifier.4\", item: compute, dim: batch, parts: {ranks}}}\n",
        "gpt2-small-s2": one + "  split:\n" + pairs,
        "gpt2-1.5b-small-s2": one + "  recompute:\n    - {path: \"blocks.*\", mode: full}\n  split:\n" + pairs,
        "dlrm-small-s2": one + "  split:\n"
        f"    - {{path: \"embeddings.*\", item: compute, dim: out, parts: {ranks}}}\n"
        f"    - {{path: \"bottom_mlp.0\", item: compute, dim: batch, parts: {ranks}}}\n",
    }


def main() -> None:
    models = OUT / "models"
    models.mkdir(parents=True, exist_ok=True)
    cnns = (("resnet50-small", "ResNet-50 blocks, 1/4 channels, 64x64", gen.resnet50, (64, 64)),
            ("vgg19-small", "VGG-19 (E), 1/4 channels, 32x32", gen.vgg19, (32, 32)),
            ("inception-v3-small", "Inception-v3, 1/4 channels, 75x75", gen.inception_v3, (75, 75)))
    for name, description, builder, hw in cnns:
        net = _build(builder, hw)
        (models / f"{name}.yaml").write_text(_cnn_yaml(name, description, net))
        (models / f"{name}.inputs.json").write_text(json.dumps(net.inputs, indent=0) + "\n")
    for name, (description, dims) in TRANSFORMERS.items():
        (models / f"{name}.yaml").write_text(_transformer_yaml(name, description, dims))
    (models / "dlrm-small.yaml").write_text(DLRM_YAML)
    for ranks in RANKS:
        folder = OUT / f"ranks{ranks}"
        folder.mkdir(exist_ok=True)
        for name, text in _trees(ranks).items():
            (folder / f"{name}.yaml").write_text(f"# {name} on {ranks} ranks (scripts/gen_proteus_small.py)\n" + text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
