"""StrategyTree (Proteus Sec. IV, VII): structure, primitives, propagation, conflicts, lowering, YAML, printing.

The small model: 4 GPT blocks, so the expanded layers are embedding, blocks.0-3, head (indices 0-5).
"""

import dataclasses
from pathlib import Path

import pytest

from trainsim.catalog import load_model
from trainsim.catalog.model_files import parse_model
from trainsim.errors import ConfigError, InputFileError
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.graph import OpGraph
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for
from trainsim.strategy.tree import Sourced, StrategyTree
from trainsim.strategy.tree_yaml import dump_tree_yaml, load_tree_yaml, tree_from_mapping, tree_to_mapping

LAYERS = ("embedding", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head")


def _graph(num_layers: int = 4, **extra: object) -> OpGraph:
    model = parse_model({"name": "tiny", "num_layers": num_layers, "hidden": 64, "ffn_hidden": 256,
                         "num_heads": 4, "vocab": 128, **extra})
    return build_graph(model, DeviceSlice(micro_batch=1, seq_len=32, precision=policy_for("bf16")))


def _catalog_graph(name: str) -> OpGraph:
    return build_graph(load_model(name), DeviceSlice(micro_batch=2, seq_len=1, precision=policy_for("bf16")))


@pytest.fixture(scope="module")
def graph() -> OpGraph:
    return _graph()


@pytest.fixture(scope="module")
def tree(graph: OpGraph) -> StrategyTree:
    return StrategyTree.from_graph(graph)


def _stages(tree: StrategyTree, par: ParallelSpec) -> tuple[tuple[int, int], ...]:
    return tuple((a.stage, a.chunk) for a in tree.lower(par).layers)


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --- structure ---


def test_transformer_tree_structure(tree: StrategyTree, graph: OpGraph) -> None:
    assert tree.layer_paths == LAYERS
    assert tree.nodes[""].children == ("embedding", "blocks", "head")
    assert tree.nodes["blocks"].kind == "group"
    assert tree.nodes["blocks"].children == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    block = tree.node("blocks.2")
    assert (block.kind, block.layer_index) == ("layer", 3)
    assert block.children == ("blocks.2.norm1", "blocks.2.attn", "blocks.2.residual1", "blocks.2.norm2",
                              "blocks.2.mlp", "blocks.2.residual2")
    assert tree.node("blocks.2.attn").children == ("blocks.2.attn.qkv", "blocks.2.attn.core", "blocks.2.attn.out")
    qkv = tree.node("blocks.2.attn.qkv")
    assert (qkv.kind, qkv.layer_index, qkv.children) == ("module", 3, ())
    assert [op.name for op in qkv.fwd] == ["qkv"]
    assert [op.name for op in qkv.bwd] == ["qkv.dgrad", "qkv.wgrad"]
    assert tree.nodes["embedding"].children == ("embedding.tokens", "embedding.positions")
    assert tree.nodes["head"].children == ("head.norm", "head.proj", "head.loss")
    assert sum(len(n.fwd) + len(n.bwd) for n in tree.nodes.values()) == graph.num_ops
    assert repr(tree) == "StrategyTree('tiny': 6 layers, 61 nodes, 0 nodes set)"


def test_moe_blocks_are_numbered_with_the_dense_ones() -> None:
    tree = StrategyTree.from_graph(_graph(num_experts=4, top_k=2))
    assert tree.layer_paths == LAYERS
    assert "blocks.3.moe.mlp.fc1" in tree.nodes
    assert tree.node("blocks.3.moe").children == ("blocks.3.moe.router", "blocks.3.moe.mlp")


def test_cnn_and_dlrm_trees() -> None:
    resnet = _catalog_graph("resnet50")
    tree = StrategyTree.from_graph(resnet)
    assert tree.layer_paths[:4] == ("stem", "layer1.0", "layer1.1", "layer1.2")  # "layer1.1..layer1.2" x2
    assert tree.layer_paths[-1] == "head"
    assert tree.nodes["layer1"].children == ("layer1.0", "layer1.1", "layer1.2")
    assert "layer1.2.conv3" in tree.nodes and "stem.conv1" in tree.nodes and "head.loss" in tree.nodes
    assert sum(len(n.fwd) + len(n.bwd) for n in tree.nodes.values()) == resnet.num_ops
    dlrm = StrategyTree.from_graph(_catalog_graph("dlrm-mlperf-terabyte"))
    assert dlrm.layer_paths == ("embeddings", "bottom_mlp", "interaction", "top_mlp")
    assert dlrm.node("bottom_mlp.0").children == ("bottom_mlp.0.relu",)  # a node with ops and children
    assert dlrm.node("bottom_mlp.0").fwd


# --- addressing ---


def test_match_patterns(tree: StrategyTree) -> None:
    assert tree.match("") == ("",)
    assert tree.match("*") == ("embedding", "blocks", "head")
    assert tree.match("blocks.*") == LAYERS[1:5]
    assert tree.match("blocks.1-2") == ("blocks.1", "blocks.2")
    assert tree.match("blocks.*.attn") == tuple(f"blocks.{i}.attn" for i in range(4))
    assert tree.match("blocks.0-1.mlp.fc?") == ("blocks.0.mlp.fc1", "blocks.0.mlp.fc2", "blocks.1.mlp.fc1",
                                                "blocks.1.mlp.fc2")
    assert tree.match("head.proj") == ("head.proj",)


@pytest.mark.parametrize(("pattern", "message"), [
    ("blocks.9", "matches no node (blocks holds: 0-3)"),
    ("block", "matches no node (<model> holds: embedding, blocks, head)"),
    ("blocks.2-7", "blocks.4 does not exist (blocks holds: 0-3)"),
    ("blocks.3-1", "range 3-1 runs backwards; write 1-3"),
    ("blocks.*.attention", "matches no node (blocks.0 holds: norm1, attn, residual1, norm2, mlp, residual2)"),
])
def test_match_errors(tree: StrategyTree, pattern: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        tree.recompute(pattern, "full")
    assert _one_line(exc) == f"recompute.path={pattern!r} is invalid: {message}"


def test_node_lookup_is_exact(tree: StrategyTree) -> None:
    with pytest.raises(ConfigError, match="no such node"):
        tree.node("blocks.*")


# --- primitive validation ---


@pytest.mark.parametrize(("args", "field", "allowed"), [
    (("bias", "heads", 2), "split.item", "'weight', 'activation', 'gradient', 'optimizer' or 'compute'"),
    (("weight", "rows", 2), "split.dim",
     "'batch', 'seq', 'hidden', 'heads', 'ffn', 'vocab', 'experts', 'flat', 'out' or 'reduce'"),
    (("weight", "heads", 0), "split.parts", "greater than 0"),
    (("weight", "heads", "2"), "split.parts", "valid integer"),
])
def test_split_validation(tree: StrategyTree, args: tuple[str, str, int], field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as exc:
        tree.split("blocks.*", *args)
    assert exc.value.field == field
    assert allowed in _one_line(exc)


@pytest.mark.parametrize(("mesh", "field", "allowed"), [
    ({"stage": -1}, "map.stage", "greater than or equal to 0"),
    ({"stage": True}, "map.stage", "not true or false"),
    ({"tp": 0}, "map.tp", "greater than 0"),
    ({"stage": 0, "pipe": 1}, "map.pipe", "unknown key"),
    ({}, "map", "give at least one of: stage, chunk, tp, dp, cp, ep"),
])
def test_map_validation(tree: StrategyTree, mesh: dict[str, object], field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as exc:
        tree.map("blocks.0", mesh)
    assert exc.value.field == field
    assert allowed in _one_line(exc)


def test_stage_places_whole_layers_but_shape_may_go_inside(tree: StrategyTree) -> None:
    with pytest.raises(ConfigError) as exc:
        tree.map("blocks.1.attn", {"stage": 1})
    assert _one_line(exc) == ("map.path='blocks.1.attn' is invalid: stage and chunk place whole layers: set it on "
                              "blocks.1 or an ancestor, not inside a layer")
    inside = tree.map("blocks.1.attn", {"tp": 2})
    assert inside.effective("blocks.1.attn.qkv")["tp"] == Sourced(2, "blocks.1.attn", "inherited")


def test_schedule_and_recompute_validation(tree: StrategyTree) -> None:
    with pytest.raises(ConfigError) as exc:
        tree.schedule("", kind="pipedream")
    assert exc.value.field == "schedule.kind" and "'gpipe', '1f1b', 'interleaved-1f1b' or 'zb-h1'" in _one_line(exc)
    with pytest.raises(ConfigError, match=r"schedule\.micro_batches=0 is invalid"):
        tree.schedule("", micro_batches=0)
    with pytest.raises(ConfigError, match="give at least one of: micro_batches, max_in_flight, kind"):
        tree.schedule("")
    with pytest.raises(ConfigError, match="a schedule applies to the model, a group or a layer"):
        tree.schedule("blocks.0.mlp", micro_batches=4)
    with pytest.raises(ConfigError) as rexc:
        tree.recompute("blocks.*", "partial")
    assert _one_line(rexc) == "recompute.mode='partial' is invalid: choose one of: none, selective, full"


def test_primitives_return_new_frozen_trees(tree: StrategyTree) -> None:
    changed = tree.recompute("blocks", "full")
    assert changed is not tree and changed != tree
    assert dict(tree.explicit) == {}
    assert dict(changed.explicit["blocks"]) == {"recompute": "full"}
    with pytest.raises(TypeError):
        changed.explicit["blocks"]["recompute"] = "none"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.graph = tree.graph  # type: ignore[misc]
    assert changed == tree.recompute("blocks", "full")


# --- propagation ---


def test_parent_to_child_and_child_override(tree: StrategyTree) -> None:
    t = tree.recompute("blocks", "full").recompute("blocks.1", "none")
    assert t.effective("blocks")["recompute"] == Sourced("full", "blocks", "set")
    assert t.effective("blocks.2.attn.qkv")["recompute"] == Sourced("full", "blocks", "inherited")
    assert t.effective("blocks.1.mlp")["recompute"] == Sourced("none", "blocks.1", "inherited")
    assert "recompute" not in t.effective("head")


def test_schedule_fields_inherit_one_by_one(tree: StrategyTree) -> None:
    t = tree.schedule("", micro_batches=8, kind="1f1b").schedule("blocks", max_in_flight=2)
    row = t.effective("blocks.0")
    assert (row["micro_batches"], row["max_in_flight"], row["kind"]) == (
        Sourced(8, "", "inherited"), Sourced(2, "blocks", "inherited"), Sourced("1f1b", "", "inherited"))


def test_stage_follows_data_dependencies(tree: StrategyTree) -> None:
    t = tree.map("embedding", {"stage": 0}).map("blocks.2", {"stage": 1})
    assert t.effective("blocks.1")["stage"] == Sourced(0, "embedding", "data-dep")
    assert t.effective("head")["stage"] == Sourced(1, "blocks.2", "data-dep")
    assert t.effective("blocks.3.attn.qkv")["stage"] == Sourced(1, "blocks.2", "data-dep")
    assert _stages(t, ParallelSpec(pp=2, dp=1)) == ((0, 0), (0, 0), (0, 0), (1, 0), (1, 0), (1, 0))


def test_leading_layers_take_the_first_mapped_stage(tree: StrategyTree) -> None:
    t = tree.map("blocks.1", {"stage": 1})
    assert t.effective("embedding")["stage"] == Sourced(1, "blocks.1", "data-dep")
    assert _stages(t, ParallelSpec(pp=2, dp=1)) == ((1, 0),) * 6


def test_mesh_shape_propagates_along_data_deps(tree: StrategyTree) -> None:
    t = tree.map("blocks.1", {"tp": 2}).map("blocks.3", {"tp": 4})
    assert [t.effective(p)["tp"].value for p in LAYERS] == [2, 2, 2, 2, 4, 4]
    assert t.effective("blocks.2.mlp.fc1")["tp"] == Sourced(2, "blocks.1", "data-dep")


def test_the_tree_wins_over_data_deps(tree: StrategyTree) -> None:
    t = tree.map("", {"stage": 0}).map("blocks.2-3", {"stage": 1})
    assert t.effective("head")["stage"] == Sourced(0, "", "inherited")
    with pytest.raises(ConfigError) as exc:
        t.lower(ParallelSpec(pp=2, dp=1))
    assert _one_line(exc) == ("map.stage=0 is invalid: head (chunk 0) comes after blocks.3 in the model but before "
                              "it in the pipeline; stages must follow model order")


def test_chunk_travels_with_stage(tree: StrategyTree) -> None:
    t = (tree.map("embedding", {"stage": 0}).map("blocks.1", {"stage": 1})
         .map("blocks.2", {"stage": 0, "chunk": 1}).map("blocks.3", {"stage": 1, "chunk": 1}))
    par = ParallelSpec(pp=2, vpp=2, dp=1, schedule="interleaved-1f1b", global_batch=4)
    assert _stages(t, par) == ((0, 0), (0, 0), (1, 0), (0, 1), (1, 1), (1, 1))


# --- conflicts ---


def test_same_node_conflicts(tree: StrategyTree) -> None:
    t = tree.map("blocks.0-2", {"stage": 0})
    with pytest.raises(ConfigError) as exc:
        t.map("blocks.2-3", {"stage": 1})
    assert _one_line(exc) == ("map.stage=1 is invalid: blocks.2 already has stage=0; set the default on an ancestor "
                              "and the exception on the node, or override")
    assert t.map("blocks.2", {"stage": 0}) == t  # the same value again is no conflict
    moved = t.map("blocks.2-3", {"stage": 1}, override=True)
    assert _stages(moved, ParallelSpec(pp=2, dp=1)) == ((0, 0), (0, 0), (0, 0), (1, 0), (1, 0), (1, 0))
    with pytest.raises(ConfigError, match=r"^split\.parts=4 is invalid: blocks\.1 already has "
                                          r"split\.weight\.heads=2"):
        tree.split("blocks.*", "weight", "heads", 2).split("blocks.1", "weight", "heads", 4)
    with pytest.raises(ConfigError, match=r"^recompute\.mode='none' is invalid"):
        tree.recompute("head", "full").recompute("*", "none")


def test_split_on_a_parent_is_a_default(tree: StrategyTree) -> None:
    t = tree.split("blocks", "weight", "heads", 2).split("blocks.1", "weight", "heads", 4).split(
        "blocks.1.attn", "activation", "seq", 2)
    assert [s.parts for s in t.splits("blocks.0.attn.qkv")] == [2]
    assert [(s.item, s.dim, s.parts) for s in t.splits("blocks.1.attn.qkv")] == [
        ("activation", "seq", 2), ("weight", "heads", 4)]


def test_lowering_conflicts(tree: StrategyTree) -> None:
    par = ParallelSpec(pp=2, tp=2, dp=1, global_batch=4)
    base = tree.map("blocks.2", {"stage": 1})
    cases = [
        (base.schedule("", kind="1f1b").schedule("blocks.1", kind="gpipe"),
         "schedule='blocks.1' is invalid: blocks.1 runs kind=gpipe but embedding runs kind=1f1b; an LoweredPlan "
         "runs one schedule: set it on the root"),
        (base.recompute("blocks.1.attn", "full"),
         "recompute.mode='full' is invalid: blocks.1.attn differs from its layer blocks.1 (unset); an LoweredPlan "
         "recomputes per layer"),
        (base.map("blocks", {"tp": 4}),
         "map.tp=4 is invalid: embedding (its tp comes from blocks): tp x cp = 4 x 1 must divide the job's 2 "
         "devices per stage (tp x dp x cp)"),
        (tree.map("head", {"stage": 2}),
         "map.stage=2 is invalid: embedding (its stage comes from head) is past the last stage: pp=2 allows 0-1"),
        (tree.map("head", {"stage": 1, "chunk": 1}),
         "map.chunk=1 is invalid: embedding (its chunk comes from head) is past the last chunk: vpp=1 allows 0-0"),
        (base.map("blocks.3", {"stage": 0}),
         "map.stage=0 is invalid: blocks.3 (chunk 0) comes after blocks.2 in the model but before it in the "
         "pipeline; stages must follow model order"),
    ]
    for bad, message in cases:
        with pytest.raises(ConfigError) as exc:
            bad.lower(par)
        assert _one_line(exc) == message
    interleaved = ParallelSpec(pp=2, vpp=2, dp=1, schedule="interleaved-1f1b", global_batch=4)
    with pytest.raises(ConfigError, match="vpp=2 needs interleaved-1f1b"):
        base.schedule("", kind="1f1b").lower(interleaved)
    with pytest.raises(ConfigError, match="interleaved-1f1b needs pp > 1"):
        tree.schedule("", kind="interleaved-1f1b").lower(ParallelSpec(dp=1))


# --- lowering ---


PP_VPP = [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (3, 1)]


@pytest.mark.parametrize(("pp", "vpp"), PP_VPP)
@pytest.mark.parametrize("num_layers", [4, 7])
def test_from_parallel_lowers_to_default_plan(pp: int, vpp: int, num_layers: int) -> None:
    graph = _graph(num_layers)
    par = ParallelSpec(pp=pp, vpp=vpp, dp=2, tp=2, sp=True, zero=1, recompute="selective", global_batch=32,
                       schedule="interleaved-1f1b" if vpp > 1 else "1f1b")
    assert StrategyTree.from_parallel(graph, par).lower(par) == default_plan(graph, par)


@pytest.mark.parametrize("name", ["resnet50", "dlrm-mlperf-terabyte"])
@pytest.mark.parametrize(("pp", "vpp"), PP_VPP)
def test_from_parallel_lowers_to_default_plan_for_cnn_and_dlrm(name: str, pp: int, vpp: int) -> None:
    graph = _catalog_graph(name)
    par = ParallelSpec(pp=pp, vpp=vpp, dp=4, global_batch=64, schedule="interleaved-1f1b" if vpp > 1 else "gpipe")
    assert StrategyTree.from_parallel(graph, par).lower(par) == default_plan(graph, par)


def test_from_parallel_with_experts_and_no_global_batch() -> None:
    graph = _graph(num_experts=4, top_k=2)
    par = ParallelSpec(pp=2, dp=2, tp=2, ep=2, recompute="full")  # global_batch=0: default_plan's 0 micro-batches
    tree = StrategyTree.from_parallel(graph, par)
    assert tree.lower(par) == default_plan(graph, par)
    assert [(s.item, s.dim, s.parts, s.axis) for s in tree.splits("blocks.2.moe.mlp.fc1")] == [
        ("activation", "batch", 2, "dp"), ("compute", "out", 2, "ep"), ("compute", "out", 2, "tp"),
        ("weight", "experts", 2, "dp"), ("weight", "ffn", 2, "dp")]  # fc1: column split over tp, experts over ep


def test_from_parallel_settings(graph: OpGraph) -> None:
    par = ParallelSpec(pp=2, dp=4, tp=2, cp=2, sp=True, zero=3, recompute="selective", global_batch=32)
    tree = StrategyTree.from_parallel(graph, par)
    assert dict(tree.explicit[""]) == {
        "tp": 2, "dp": 4, "cp": 2, "ep": 1, "kind": "1f1b", "recompute": "selective", "micro_batches": 8,
        "split.activation.batch": 4, "split.activation.seq": 4, "split.optimizer.flat": 4,
        "split.gradient.flat": 4, "split.weight.flat": 4}
    assert {p: dict(r) for p, r in tree.explicit.items() if "stage" in r} == {
        "embedding": {"stage": 0, "split.weight.vocab": 2}, "blocks.2": {"stage": 1}}
    assert dict(tree.explicit["blocks.3.attn"]) == {"split.weight.heads": 2}
    assert dict(tree.explicit["blocks.3.mlp"]) == {"split.weight.ffn": 2}
    with pytest.raises(ConfigError, match=r"^dp=0 is invalid: resolve dp=0"):
        StrategyTree.from_parallel(graph, ParallelSpec(dp=0))


def test_uneven_stages_per_layer_recompute_and_schedule(tree: StrategyTree) -> None:
    t = (tree.schedule("", micro_batches=6, max_in_flight=2, kind="zb-h1")
         .map("embedding", {"stage": 0}).map("blocks.1", {"stage": 1})
         .recompute("", "selective").recompute("blocks.3", "full"))
    plan = t.lower(ParallelSpec(pp=2, dp=1, recompute="none"))
    assert [(a.index, a.stage, a.chunk, a.recompute) for a in plan.layers] == [
        (0, 0, 0, "selective"), (1, 0, 0, "selective"), (2, 1, 0, "selective"), (3, 1, 0, "selective"),
        (4, 1, 0, "full"), (5, 1, 0, "selective")]
    assert (plan.num_stages, plan.num_chunks, plan.num_micro_batches, plan.schedule, plan.max_in_flight) == (
        2, 1, 6, "zb-h1", 2)
    assert plan.layers[3].layer is t.graph.layers[1]


def test_an_empty_tree_lowers_with_the_jobs_settings(tree: StrategyTree) -> None:
    par = ParallelSpec(dp=2, global_batch=8, recompute="full", schedule="gpipe")
    assert tree.lower(par) == default_plan(tree.graph, par)
    with pytest.raises(ConfigError, match="the micro-batch count depends on it"):
        tree.lower(ParallelSpec(dp=0))
    assert tree.schedule("", micro_batches=3).lower(ParallelSpec(dp=0)).num_micro_batches == 3


# --- YAML ---


BRIEF_YAML = """\
strategy_tree:
  schedule: {micro_batches: 8, kind: 1f1b}
  map:
    - {path: "embedding", stage: 0}
    - {path: "blocks.0-9", stage: 0}
    - {path: "blocks.10-23", stage: 1}
  recompute:
    - {path: "blocks.*", mode: selective}
  split:
    - {path: "blocks.*", item: weight, dim: heads, parts: 2}
"""


def test_yaml_example_loads_and_lowers(tmp_path: Path) -> None:
    graph = _graph(24)
    path = tmp_path / "tree.yaml"
    path.write_text(BRIEF_YAML)
    plan = load_tree_yaml(path, graph).lower(ParallelSpec(pp=2, dp=1, tp=2))
    assert [a.stage for a in plan.layers] == [0] * 11 + [1] * 15
    assert [a.recompute for a in plan.layers] == ["none"] + ["selective"] * 24 + ["none"]
    assert (plan.num_micro_batches, plan.schedule) == (8, "1f1b")


def test_yaml_round_trip(tmp_path: Path) -> None:
    graph = _graph(8)
    par = ParallelSpec(pp=4, vpp=2, dp=2, tp=2, sp=True, zero=2, global_batch=16, schedule="interleaved-1f1b")
    tree = StrategyTree.from_parallel(graph, par).recompute("blocks.5", "full")
    text = dump_tree_yaml(tree)
    assert "{path: blocks.0-7.attn, item: weight, dim: heads, parts: 2}" in text
    path = tmp_path / "tree.yaml"
    path.write_text(text)
    loaded = load_tree_yaml(path, graph)
    assert loaded == tree
    assert loaded.lower(par) == tree.lower(par)
    assert tree_from_mapping(tree_to_mapping(tree)["strategy_tree"], graph) == tree


def test_yaml_schedules_on_several_nodes(graph: OpGraph) -> None:
    tree = tree_from_mapping({"schedule": [{"micro_batches": 4}, {"path": "blocks", "max_in_flight": 2}]}, graph)
    assert tree.effective("blocks.1")["max_in_flight"] == Sourced(2, "blocks", "inherited")
    assert tree_to_mapping(tree)["strategy_tree"]["schedule"] == [
        {"path": "", "micro_batches": 4}, {"path": "blocks", "max_in_flight": 2}]
    assert tree_from_mapping(None, graph) == StrategyTree.from_graph(graph)


@pytest.mark.parametrize(("text", "message"), [
    ("pipeline: {}\n", "pipeline: unknown key; a strategy-tree file holds one key, strategy_tree"),
    ("other: 1\nstrategy_tree: {}\n", "other: unknown key"),
    ("strategy_tree: [1]\n", "strategy_tree=[1] is invalid: must be a mapping with keys schedule, map, "),
    ("strategy_tree: {pipeline: 2}\n", "strategy_tree.pipeline: unknown key; allowed: schedule, map, "),
    ("strategy_tree: {map: {path: head}}\n", "strategy_tree.map={'path': 'head'} is invalid: must be a list of "),
    ("strategy_tree: {split: [blocks]}\n", "strategy_tree.split[0]='blocks' is invalid: must be a mapping such as"),
    ("strategy_tree: {map: [{path: head, pipe: 1}]}\n", "strategy_tree.map[0].pipe: unknown key"),
    ("strategy_tree: {map: [{path: head}]}\n", "strategy_tree.map[0]={} is invalid: give at least one of: stage"),
    ("strategy_tree: {map: [{path: 'blocks.0-30', stage: 0}]}\n",
     "strategy_tree.map[0].path='blocks.0-30' is invalid: blocks.4 does not exist (blocks holds: 0-3)"),
    ("strategy_tree: {recompute: [{path: head, mode: most}]}\n",
     "strategy_tree.recompute[0].mode='most' is invalid: Input should be 'none', 'selective' or 'full'"),
    ("strategy_tree: {split: [{item: weight, dim: heads, parts: 0}]}\n",
     "strategy_tree.split[0].parts=0 is invalid: Input should be greater than 0"),
    ("strategy_tree: {split: [{item: weight, dim: heads}]}\n",
     "strategy_tree.split[0].parts: Field required"),
    ("strategy_tree: {schedule: {kind: pipedream}}\n", "strategy_tree.schedule.kind='pipedream' is invalid"),
    ("strategy_tree: {map: [{path: 'blocks.*', stage: 0}, {path: blocks.3, stage: 1}]}\n",
     "strategy_tree.map[1].stage=1 is invalid: blocks.3 already has stage=0"),
])
def test_yaml_bad_values(tmp_path: Path, graph: OpGraph, text: str, message: str) -> None:
    path = tmp_path / "tree.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_tree_yaml(path, graph)
    assert _one_line(exc).startswith(message)


def test_yaml_bad_files(tmp_path: Path, graph: OpGraph) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("strategy_tree: {map: [\n")
    with pytest.raises(InputFileError, match="is not valid YAML"):
        load_tree_yaml(broken, graph)
    with pytest.raises(InputFileError, match="cannot read"):
        load_tree_yaml(tmp_path / "missing.yaml", graph)
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    with pytest.raises(ConfigError, match="holds no strategy_tree mapping"):
        load_tree_yaml(empty, graph)


# --- printing ---


def test_pretty_marks_inherited_and_propagated_values(tree: StrategyTree) -> None:
    t = tree.map("embedding", {"stage": 0}).map("blocks.2", {"stage": 1}).recompute("blocks", "full").split(
        "blocks.2.attn", "weight", "heads", 2)
    lines = t.pretty().splitlines()
    assert lines[0] == ("StrategyTree tiny: 6 layers, 61 nodes (^ inherited from an ancestor, < propagated along "
                        "data dependencies)")
    assert lines[1] == "<model>"
    assert "  embedding [layer 0: embedding]  stage=0" in lines
    assert "  blocks  recompute=full" in lines
    assert "    blocks.1 [layer 2: block]  stage=0< recompute=full^" in lines
    assert "    blocks.2 [layer 3: block]  stage=1 recompute=full^" in lines
    assert "      blocks.2.attn  split.weight.heads=2" in lines
    assert "        blocks.2.attn.qkv (1 fwd + 2 bwd ops)" in lines
    assert "  head [layer 5: head]  stage=1<" in lines
    verbose = t.pretty(verbose=True).splitlines()
    assert "        blocks.2.attn.qkv (1 fwd + 2 bwd ops)  stage=1^ recompute=full^ split.weight.heads=2^" in verbose
    assert t.pretty(max_depth=1).splitlines()[1:] == [
        "<model>", "  embedding [layer 0: embedding]  stage=0", "  blocks  recompute=full",
        "  head [layer 5: head]  stage=1<"]
