"""`trainsim predict --engine sim` with --trace and --explain, end to end through the CLI."""

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app
from trainsim.strategy.precision import policy_for

RUNNER = CliRunner()
ARGS = ["predict", "--engine", "sim", "--pp", "2", "--tp", "2", "--global-batch", "16", "--model", "gpt3-125m"]


def test_trace_and_explain(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    result = RUNNER.invoke(app, [*ARGS, "--trace", str(trace), "--explain"])
    assert result.exit_code == 0, result.output
    assert "critical path:" in result.stdout and "exposed communication per type" in result.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    tasks = [e for e in events if e["ph"] == "X"]
    assert tasks and all({"ph", "ts", "dur", "pid", "tid"} <= e.keys() for e in tasks)
    assert {e["pid"] for e in tasks} == {0, 1}  # a process per simulated pipeline stage
    assert any(e["ph"] == "C" for e in events)  # memory counter track


def test_sim_json_matches_result_keys() -> None:
    result = RUNNER.invoke(app, [*ARGS, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["engine"] == "sim"
    assert abs(sum(data["breakdown"].values()) - data["iteration_time_s"]) < 1e-9 * data["iteration_time_s"]


def test_oom_plan_is_reported_not_raised() -> None:
    result = RUNNER.invoke(app, ["predict", "--engine", "sim", "--model", "gpt3-175b", "--num-gpus", "8",
                                 "--global-batch", "8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["oom"] is True and data["memory_breakdown"]["weights"] > 0


def test_trace_needs_the_simulator(tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["predict", "--trace", str(tmp_path / "t.json")])
    assert result.exit_code == 2
    assert "--engine sim" in result.stderr and not (tmp_path / "t.json").exists()


def test_strategy_tree_file_changes_the_plan(tmp_path: Path) -> None:
    tree = tmp_path / "tree.yaml"
    tree.write_text("strategy_tree:\n  map:\n    - {path: embedding, stage: 0}\n    - {path: blocks.0-1, stage: 0}\n"
                    "    - {path: blocks.2-11, stage: 1}\n")
    plain = RUNNER.invoke(app, [*ARGS, "--json"])
    uneven = RUNNER.invoke(app, [*ARGS, "--json", "--tree", str(tree)])
    assert plain.exit_code == 0 and uneven.exit_code == 0, uneven.output
    # 2 blocks against 10 on the two stages: the second stage is the bottleneck and the iteration is longer
    assert json.loads(uneven.stdout)["iteration_time_s"] > 1.2 * json.loads(plain.stdout)["iteration_time_s"]


def test_unknown_cost_model_is_refused() -> None:
    result = RUNNER.invoke(app, ["predict", "--costs", "guess"])
    assert result.exit_code == 2
    assert "costs='guess'" in result.stderr and "roofline" in result.stderr


def test_stages_of_their_own_device_counts_from_the_shipped_tree_file(tmp_path: Path) -> None:
    """data/strategies/megatron/gpt3-1.3b-stages-4-12.yaml (stage 0 on 4 GPUs, stage 1 on 12) against the same
    layers on 8 + 8: the larger stage on more GPUs is faster."""
    root = Path(__file__).resolve().parents[3]
    args = ["predict", "--model", "gpt3-1.3b", "--num-gpus", "16", "--tp", "2", "--pp", "2", "--micro-batch", "3",
            "--global-batch", "96", "--seq-len", "2048", "--engine", "sim", "--json", "--tree"]
    sized = RUNNER.invoke(app, [*args, str(root / "data" / "strategies" / "megatron" / "gpt3-1.3b-stages-4-12.yaml")])
    assert sized.exit_code == 0, sized.output
    equal = tmp_path / "equal.yaml"  # the same layers, each stage on the job's 8 GPUs
    equal.write_text("strategy_tree:\n  map:\n    - {stage: 0}\n    - {path: blocks.6-23, stage: 1}\n"
                     "    - {path: head, stage: 1}\n")
    even = RUNNER.invoke(app, [*args, str(equal)])
    assert even.exit_code == 0, even.output
    assert json.loads(sized.stdout)["iteration_time_s"] < 0.8 * json.loads(even.stdout)["iteration_time_s"]


def test_stage_sizes_that_do_not_sum_to_the_jobs_gpus_are_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree.yaml"
    tree.write_text("strategy_tree:\n  map:\n    - {stage: 0}\n    - {path: blocks.6-11, stage: 1, dp: 3}\n"
                    "    - {path: head, stage: 1, dp: 3}\n")
    result = RUNNER.invoke(app, [*ARGS, "--tree", str(tree)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "map.dp=3 is invalid" in lines[0] and "must sum to the job's 8 GPUs" in lines[0]


def test_three_stages_on_1_1_and_2_of_4_gpus_with_dp_given() -> None:
    """data/strategies/megatron/gpt3-125m-stages-1-1-2.yaml: pp 3 does not divide 4 GPUs; with --dp 1 and a tree
    whose stages sum to 4 the job runs; without the tree, or with a tree that sizes no stage, it is refused."""
    root = Path(__file__).resolve().parents[3]
    args = ["predict", "--model", "gpt3-125m", "--num-gpus", "4", "--pp", "3", "--dp", "1", "--micro-batch", "2",
            "--global-batch", "16", "--seq-len", "1024", "--engine", "sim"]
    sized = RUNNER.invoke(app, [*args, "--json", "--tree",
                                str(root / "data" / "strategies" / "megatron" / "gpt3-125m-stages-1-1-2.yaml")])
    assert sized.exit_code == 0, sized.output
    out = json.loads(sized.stdout)
    assert out["num_gpus"] == 4 and out["iteration_time_s"] > 0
    plain = RUNNER.invoke(app, args)
    assert plain.exit_code == 2 and "tp*pp*dp*cp=3 is invalid: must equal the number of GPUs (4)" in plain.stderr


def test_a_tree_that_sizes_no_stage_must_fill_the_gpus(tmp_path: Path) -> None:
    tree = tmp_path / "tree.yaml"
    tree.write_text("strategy_tree:\n  map:\n    - {stage: 0}\n    - {path: blocks.4-7, stage: 1}\n"
                    "    - {path: blocks.8-11, stage: 2}\n    - {path: head, stage: 2}\n")
    result = RUNNER.invoke(app, ["predict", "--model", "gpt3-125m", "--num-gpus", "4", "--pp", "3", "--dp", "1",
                                 "--micro-batch", "2", "--global-batch", "16", "--seq-len", "1024", "--engine", "sim",
                                 "--tree", str(tree)])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: dp=1 is invalid: the 3 stages hold the job's tp x dp x cp = 1 x 1 x 1 "
                                     "devices each, 3 of its 4 GPUs; map stages to device counts of their own (dp) "
                                     "that sum to 4, or give a dp that fills the GPUs")


def test_attention_only_tp_from_the_shipped_tree_file_lands_between_tp2_and_tp1(tmp_path: Path) -> None:
    """data/strategies/megatron/gpt-tp2-attn-only.yaml (the MLP whole on each of the 2 tp ranks): more compute
    than plain tp 2, less than tp 1 on the same data-parallel degree (each rank the whole model), and half the
    tensor-parallel communication of plain tp 2 (one all-reduce pair per block instead of two). A module split
    on some of its ops only is refused in one line, exit 2."""
    root = Path(__file__).resolve().parents[3]
    args = ["predict", "--model", "gpt3-125m", "--micro-batch", "4", "--global-batch", "64", "--seq-len", "1024",
            "--engine", "sim", "--json"]
    tree = str(root / "data" / "strategies" / "megatron" / "gpt-tp2-attn-only.yaml")
    runs = {name: RUNNER.invoke(app, [*args, *extra]) for name, extra in (
        ("attn", ["--num-gpus", "8", "--tp", "2", "--tree", tree]), ("tp2", ["--num-gpus", "8", "--tp", "2"]),
        ("tp1", ["--num-gpus", "4", "--tp", "1"]))}
    assert all(run.exit_code == 0 for run in runs.values()), [run.output for run in runs.values()]
    out = {name: json.loads(run.stdout) for name, run in runs.items()}
    compute = {name: data["breakdown"]["compute"] for name, data in out.items()}
    assert compute["tp2"] < compute["attn"] < compute["tp1"]
    assert out["attn"]["breakdown"]["tp_comm"] < 0.6 * out["tp2"]["breakdown"]["tp_comm"]
    assert out["tp2"]["memory_breakdown"]["weights"] < out["attn"]["memory_breakdown"]["weights"] \
        < out["tp1"]["memory_breakdown"]["weights"]
    bad = tmp_path / "bad.yaml"  # the attention core split by a reduction dimension it does not have
    bad.write_text("strategy_tree:\n  split:\n" + "".join(
        f"    - {{path: {path}, item: compute, dim: {dim}, parts: 2, axis: tp}}\n" for path, dim in (
            ("embedding.tokens", "reduce"), ("blocks.*.attn.qkv", "out"), ("blocks.*.attn.core", "reduce"),
            ("blocks.*.attn.out", "reduce"), ("head.proj", "out"), ("head.loss", "out"))))
    broken = RUNNER.invoke(app, [*args, "--num-gpus", "8", "--tp", "2", "--tree", str(bad)])
    assert broken.exit_code == 2
    lines = broken.stderr.strip().splitlines()
    assert len(lines) == 1 and "blocks.0.attn.core split.compute@tp='reduce=2' is invalid" in lines[0]
    assert "any split of its batch, seq, out whose parts divide 2" in lines[0]


def test_trees_with_splits_other_than_megatrons_run_and_move_what_their_layouts_need() -> None:
    """data/strategies/megatron/gpt-tp2-qkv-reduce.yaml, gpt-tp2-attn-seq.yaml and gpt-tp2-mlp-tokens.yaml in the
    simulator at both task levels and in the analytical engine: each rank does plain tp 2's FLOPs; qkv by its
    reduction dimension moves more than Megatron's column split (a reduce-scatter and an all-gather of q, k and
    v), the core by query rows more still (two all-to-alls each way and the key/value gathers), the MLP by
    tokens less (all-gathers of a hidden state in place of all-reduces) for the whole MLP's weights on each
    rank."""
    root = Path(__file__).resolve().parents[3]
    args = ["predict", "--model", "gpt3-125m", "--num-gpus", "8", "--tp", "2", "--micro-batch", "4",
            "--global-batch", "64", "--seq-len", "1024", "--json"]
    for engine in (["--engine", "sim", "--task-level", "layer"], ["--engine", "sim", "--task-level", "op"],
                   ["--engine", "analytical"]):
        runs = {name: RUNNER.invoke(app, [*args, *engine, *(
            ["--tree", str(root / "data" / "strategies" / "megatron" / f"gpt-tp2-{name}.yaml")] if name else [])])
            for name in ("", "qkv-reduce", "attn-seq", "mlp-tokens")}
        assert all(run.exit_code == 0 for run in runs.values()), [run.output for run in runs.values()]
        out = {name: json.loads(run.stdout) for name, run in runs.items()}
        compute = {name: data["breakdown"]["compute"] for name, data in out.items()}
        assert all(abs(value / compute[""] - 1.0) < 1e-3 for value in compute.values())
        tp = {name: data["breakdown"]["tp_comm"] for name, data in out.items()}
        assert tp["mlp-tokens"] < tp[""] < tp["qkv-reduce"] < tp["attn-seq"]
        weights = {name: data["memory_breakdown"]["weights"] for name, data in out.items()}
        assert weights[""] == weights["qkv-reduce"] == weights["attn-seq"] < weights["mlp-tokens"]


def test_a_tree_splitting_the_norms_by_sequence_without_sp_runs_in_both_engines() -> None:
    """data/strategies/megatron/gpt-tp2-norms-seq.yaml (a block's norms and residual adds by sequence over the tp
    pair, the job without sp) in the simulator and the analytical engine: each rank runs the norms and residual
    adds on half the tokens (less compute than plain tp 2, a little more than
    with sp, which splits the embedding's positions and the head's norm too), moves
    more over tp (each module's all-reduce becomes a reduce-scatter and an all-gather, and the block hands on the
    whole hidden state: one all-gather more each way) and holds the norms whole (more weights).
    gpt-tp2-lookup-tokens.yaml (the tied lookup by tokens, the projection whole) holds the table whole and
    computes all the logits on each rank."""
    root = Path(__file__).resolve().parents[3]
    tree = str(root / "data" / "strategies" / "megatron" / "gpt-tp2-norms-seq.yaml")
    args = ["predict", "--model", "gpt3-125m", "--num-gpus", "8", "--tp", "2", "--micro-batch", "4",
            "--global-batch", "64", "--seq-len", "1024", "--json"]
    for engine in ("sim", "analytical"):
        runs = {name: RUNNER.invoke(app, [*args, "--engine", engine, *extra]) for name, extra in (
            ("plain", []), ("sp", ["--sp"]), ("norms", ["--tree", tree]))}
        assert all(run.exit_code == 0 for run in runs.values()), [run.output for run in runs.values()]
        out = {name: json.loads(run.stdout) for name, run in runs.items()}
        compute = {name: data["breakdown"]["compute"] for name, data in out.items()}
        assert compute["sp"] < compute["norms"] < compute["plain"]
        tp = {name: data["breakdown"]["tp_comm"] for name, data in out.items()}
        assert tp["plain"] < tp["norms"]
        weights = {name: data["memory_breakdown"]["weights"] for name, data in out.items()}
        assert weights["plain"] == weights["sp"] < weights["norms"]
        lookup = RUNNER.invoke(app, [*args, "--engine", engine, "--tree", tree.replace("norms-seq", "lookup-tokens")])
        assert lookup.exit_code == 0, lookup.output
        by_tokens = json.loads(lookup.stdout)  # the tied table whole: every rank computes all the logits
        assert by_tokens["memory_breakdown"]["weights"] > weights["plain"]
        assert by_tokens["breakdown"]["compute"] > compute["plain"]


@pytest.mark.parametrize(("tree_name", "head_norm_params_fewer"), [
    ("gpt-tp2-norms-features.yaml", 768), ("gpt-tp2-adds-features.yaml", 0), ("gpt-tp2-adds-seq.yaml", 0)])
def test_a_tree_splitting_norms_or_adds_by_features_runs_in_both_engines(tree_name: str,
                                                                         head_norm_params_fewer: int) -> None:
    """data/strategies/megatron/gpt-tp2-norms-features.yaml (each block's norms and the head's norm split by their
    hidden features over the tp pair) and gpt-tp2-adds-features.yaml (each block's residual adds and the
    positions split so), the job without sp, in the simulator and the analytical engine: each rank runs those ops
    on half the features (less compute than plain tp 2) and moves more over tp (the norms' outputs all-gathered
    for qkv, fc1 and the projection and each norm's statistics all-reduced; the row-parallel partial sums
    reduce-scattered, the sums all-gathered for norm2 and the next block, the skip inputs' gradients gathered).
    The norms tree holds half the head norm's gain and bias (768 parameters of gpt3-125m fewer than plain tp 2,
    which counts it whole; the blocks' norms as plain tp 2 counts them, divided by tp); the adds tree the weights
    plain tp 2 holds (half the position table: plain tp 2 divides it by tp too). gpt-tp2-adds-seq.yaml splits the
    adds by sequence beside whole norms instead: half the tokens, the skip inputs' gradient halves gathered
    (test_shape_layers_add_tokens.py), no weights of their own. The engines agree within 1%."""
    root = Path(__file__).resolve().parents[3]
    tree = str(root / "data" / "strategies" / "megatron" / tree_name)
    args = ["predict", "--model", "gpt3-125m", "--num-gpus", "8", "--tp", "2", "--micro-batch", "4",
            "--global-batch", "64", "--seq-len", "1024", "--json"]
    iteration: dict[str, float] = {}
    for engine in ("sim", "analytical"):
        runs = {name: RUNNER.invoke(app, [*args, "--engine", engine, *extra]) for name, extra in (
            ("plain", []), ("features", ["--tree", tree]))}
        assert all(run.exit_code == 0 for run in runs.values()), [run.output for run in runs.values()]
        out = {name: json.loads(run.stdout) for name, run in runs.items()}
        assert out["features"]["breakdown"]["compute"] < out["plain"]["breakdown"]["compute"]
        assert out["features"]["breakdown"]["tp_comm"] > out["plain"]["breakdown"]["tp_comm"]
        weights = {name: data["memory_breakdown"]["weights"] for name, data in out.items()}
        assert weights["plain"] - weights["features"] == head_norm_params_fewer * policy_for("bf16").weight_bytes
        iteration[engine] = out["features"]["iteration_time_s"]
    assert abs(iteration["analytical"] / iteration["sim"] - 1.0) < 0.01


def test_stages_on_their_own_meshes_with_their_own_op_configs(tmp_path: Path) -> None:
    """The shipped GPT-3 1.3B trees whose stage 1 runs tp 4 x dp 2 beside stage 0's tp 2 x dp 4
    (data/strategies/megatron/gpt3-1.3b-stage1-tp4*.yaml): with its attention whole, or its MLP over pairs, stage 1
    computes more and communicates less over tp than with Megatron's splits on both meshes (the attention's
    repeats the most), and the HFU counts the repeated modules. gpt3-1.3b-stage1-dp-mlp-split.yaml splits stage
    1's MLP over pairs of its 8 data-parallel ranks: stage 1 holds less weight than without the splits. A config
    that is not its stage's is refused in one line, exit 2."""
    root = Path(__file__).resolve().parents[3] / "data" / "strategies" / "megatron"
    args = ["predict", "--model", "gpt3-1.3b", "--num-gpus", "16", "--tp", "2", "--pp", "2", "--global-batch", "64",
            "--seq-len", "2048", "--engine", "sim", "--json", "--tree"]

    def run(tree: Path, micro_batch: int = 1) -> dict[str, Any]:
        result = RUNNER.invoke(app, [*args, str(tree), "--micro-batch", str(micro_batch)])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def stage1(out: dict[str, Any], what: str) -> float:
        return sum(t["end_s"] - t["start_s"] for t in out["timeline"]["tasks"] if t["device"] == 1
                   and t["category"] == what and (what != "compute" or t["stream"] == "compute"))

    out = {name: run(root / f"gpt3-1.3b-stage1-tp4{name}.yaml") for name in ("", "-attn-whole", "-mlp-pairs")}
    plain, whole, pairs = out[""], out["-attn-whole"], out["-mlp-pairs"]
    assert stage1(plain, "compute") < stage1(pairs, "compute") < stage1(whole, "compute")
    assert stage1(whole, "tp_comm") < stage1(pairs, "tp_comm") < stage1(plain, "tp_comm")
    assert plain["hfu"] == plain["mfu"] and whole["hfu"] > pairs["hfu"] > pairs["mfu"] > whole["mfu"]
    split = run(root / "gpt3-1.3b-stage1-dp-mlp-split.yaml", micro_batch=2)
    bare = tmp_path / "bare.yaml"  # the same meshes without the splits
    bare.write_text("strategy_tree:\n  map:\n    - {stage: 0, tp: 2}\n"
                    "    - {path: blocks.12-23, stage: 1, tp: 1, dp: 8}\n    - {path: head, stage: 1, tp: 1, dp: 8}\n")
    weights = [data["timeline"]["devices"][1]["breakdown_at_peak"]["weights"] for data in (run(bare, 2), split)]
    assert weights[1] < 0.7 * weights[0]  # the MLP (2/3 of a block's weights) in halves
    bad = tmp_path / "bad.yaml"  # fc1 over 4 ranks on stage 0, whose mesh is tp 2
    bad.write_text((root / "gpt3-1.3b-stage1-tp4-mlp-pairs.yaml").read_text().replace(
        '{path: "blocks.*.mlp.fc1", item: compute, dim: out, parts: 2', '{path: "blocks.*.mlp.fc1", item: compute, '
        'dim: out, parts: 4'))
    result = RUNNER.invoke(app, [*args, str(bad), "--micro-batch", "1"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ops take Megatron's splits over tp=2: fc1 splits out=2" in lines[0]


def test_a_stage_on_its_own_mesh_under_interleaving(tmp_path: Path) -> None:
    """data/strategies/megatron/gpt3-1.3b-vpp2-stage1-tp4.yaml: GPT-3 1.3B at pp 2 x vpp 2, pipeline rank 1 (both
    its chunks) on tp 4 x dp 2 beside rank 0's tp 2 x dp 4. Rank 1 computes and communicates over tp what the
    same layers do on stage 1 at vpp 1 (gpt3-1.3b-stage1-tp4.yaml) and holds the same weights, more activations
    (interleaving keeps more in flight), and each of its pipeline transfers (three chunk boundaries crossing the two
    meshes instead of one) lasts what vpp 1's does.
    The analytical engine refuses the tree as it does at vpp 1; a tree giving rank 1's two chunks two meshes is
    refused in one line, exit 2."""
    root = Path(__file__).resolve().parents[3] / "data" / "strategies" / "megatron"
    args = ["predict", "--model", "gpt3-1.3b", "--num-gpus", "16", "--tp", "2", "--pp", "2", "--global-batch", "64",
            "--seq-len", "2048", "--micro-batch", "1"]
    interleaved = ["--vpp", "2", "--schedule", "interleaved-1f1b"]

    def run(tree: Path, *more: str) -> dict[str, Any]:
        result = RUNNER.invoke(app, [*args, *more, "--engine", "sim", "--json", "--tree", str(tree)])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def rank1(out: dict[str, Any], what: str) -> float:
        return sum(t["end_s"] - t["start_s"] for t in out["timeline"]["tasks"] if t["device"] == 1
                   and t["category"] == what and (what != "compute" or t["stream"] == "compute"))

    vpp1 = run(root / "gpt3-1.3b-stage1-tp4.yaml")
    vpp2 = run(root / "gpt3-1.3b-vpp2-stage1-tp4.yaml", *interleaved)
    for what in ("compute", "tp_comm"):
        assert rank1(vpp2, what) == pytest.approx(rank1(vpp1, what), rel=1e-9)
    hops = [{round(t["end_s"] - t["start_s"], 12) for t in out["timeline"]["tasks"] if t["category"] == "pp_comm"
             and t["stream"] == "feature"} for out in (vpp1, vpp2)]
    assert len(hops[0]) == 1 and hops[1] == hops[0]  # every chunk boundary's transfer priced as vpp 1's one
    at_peak = [out["timeline"]["devices"][1]["breakdown_at_peak"] for out in (vpp1, vpp2)]
    assert at_peak[1]["weights"] == at_peak[0]["weights"]
    assert at_peak[1]["activations"] > at_peak[0]["activations"]
    analytical = [RUNNER.invoke(app, [*args, *more, "--tree", str(root / name)]) for name, more in (
        ("gpt3-1.3b-stage1-tp4.yaml", []), ("gpt3-1.3b-vpp2-stage1-tp4.yaml", interleaved))]
    assert [r.exit_code for r in analytical] == [2, 2]
    assert analytical[0].stderr == analytical[1].stderr and len(analytical[1].stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.yaml"  # rank 1's chunk 1 back on the job's tp 2
    bad.write_text((root / "gpt3-1.3b-vpp2-stage1-tp4.yaml").read_text().replace(
        '{path: "blocks.18-23", stage: 1, chunk: 1, tp: 4}', '{path: "blocks.18-23", stage: 1, chunk: 1, tp: 2}'))
    result = RUNNER.invoke(app, [*args, *interleaved, "--engine", "sim", "--tree", str(bad)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "a stage's mesh holds every model chunk of that rank" in lines[0]


def _mixtral_plain_and_tree(tree_name: str, engine: str, extra: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`predict --json` of Mixtral 8x7B's block, 8 layers, at tp 2 x ep 2 (and `extra`), plain and with the tree
    data/strategies/megatron/TREE_NAME, in `engine`."""
    root = Path(__file__).resolve().parents[3]
    args = ["predict", "--model", str(root / "data" / "strategies" / "megatron" / "models" / "mixtral-8x7b-l8.yaml"),
            "--num-gpus", "8", "--tp", "2", "--ep", "2", *extra, "--micro-batch", "1", "--seq-len", "1024",
            "--global-batch", "16", "--json", "--engine", engine]
    plain = RUNNER.invoke(app, args)
    with_tree = RUNNER.invoke(app, [*args, "--tree", str(root / "data" / "strategies" / "megatron" / tree_name)])
    assert plain.exit_code == 0 and with_tree.exit_code == 0, with_tree.output
    after = json.loads(with_tree.stdout)
    assert after["engine"] == engine
    return json.loads(plain.stdout), after


def test_mixtral_tree_with_whole_experts_in_both_engines() -> None:
    """data/strategies/megatron/mixtral-tp2-ep2-experts-whole.yaml (Megatron-Core's expert tensor parallelism 1
    at tp 2 x ep 2 with sp) on Mixtral 8x7B's block, 8 layers, against the plain plan, in the simulator and the
    closed form: no expert all-gather or reduce-scatter (less tp time), all-to-alls of the rank's own tokens as
    the plain plan's (Megatron-Core's all-to-all dispatcher under sp: the same ep time in the closed form; the
    simulator shares the links with the larger expert gradient reduction), the experts' weights twice over (more
    weight memory), the same model FLOPs."""
    for engine in ("sim", "analytical"):
        before, after = _mixtral_plain_and_tree("mixtral-tp2-ep2-experts-whole.yaml", engine, ["--sp"])
        assert after["breakdown"]["tp_comm"] < 0.7 * before["breakdown"]["tp_comm"]
        ep_before, ep_after = before["breakdown"]["ep_comm"], after["breakdown"]["ep_comm"]
        assert ep_after == ep_before if engine == "analytical" else abs(ep_after / ep_before - 1.0) < 0.2
        assert after["memory_breakdown"]["weights"] > 1.8 * before["memory_breakdown"]["weights"]
        assert after["model_flops_per_iteration"] == before["model_flops_per_iteration"]


def test_mixtral_tree_with_the_norms_and_router_by_sequence_in_both_engines() -> None:
    """data/strategies/megatron/mixtral-tp2-ep2-norms-router-seq.yaml (tp 2 x ep 2 without sp, each MoE block's
    norms, residual adds and router on half the sequence) against the plain plan, in the simulator and the closed
    form: each rank dispatches its own half of the tokens (half the all-to-all bytes: less ep time), gathers the
    routed tokens over the pair and reduce-scatters them back (more tp time), runs the norms and the router on
    half the tokens (less compute) and holds the norms and the router whole (more weight memory)."""
    for engine in ("sim", "analytical"):
        before, after = _mixtral_plain_and_tree("mixtral-tp2-ep2-norms-router-seq.yaml", engine, [])
        assert after["breakdown"]["ep_comm"] < 0.7 * before["breakdown"]["ep_comm"]  # half the bytes, and latency
        assert after["breakdown"]["tp_comm"] > before["breakdown"]["tp_comm"]
        assert after["breakdown"]["compute"] < before["breakdown"]["compute"]
        assert after["memory_breakdown"]["weights"] > before["memory_breakdown"]["weights"]


def test_the_analytical_engine_refuses_a_tree_that_places_layers() -> None:
    root = Path(__file__).resolve().parents[3]
    result = RUNNER.invoke(app, ["predict", "--model", "gpt3-125m", "--num-gpus", "4", "--pp", "3", "--dp", "1",
                                 "--micro-batch", "2", "--global-batch", "16", "--seq-len", "1024", "--tree",
                                 str(root / "data" / "strategies" / "megatron" / "gpt3-125m-stages-1-1-2.yaml")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "engine='analytical' is invalid" in lines[0] and "needs --engine sim" in lines[0]
