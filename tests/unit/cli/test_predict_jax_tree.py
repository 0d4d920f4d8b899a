"""`trainsim predict --frontend jax --tree FILE`: the shipped JAX train step (data/strategies/frontend/jax_gpt.py,
4 pre-norm GPT blocks of hidden 256, 4 heads, ffn 1024, attention as einsums, fp32) split over tp 2 by the shipped
tree (Megatron's attention and MLP), and one-line refusals (exit 2).

A block's parameters: two norms 2 x 2 x 256, qkv 256 x 768 + 768, the projection 256 x 256 + 256, fc1 256 x 1024 +
1024, fc2 1024 x 256 + 256: 789760; split as Megatron's, a rank holds half of each of the four weights (196608 +
65536 + 262144 + 262144 = 786432, half of it fewer), the biases and the norms whole.
"""

import json

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import app

pytest.importorskip("jax")
pytest.importorskip("networkx")

RUNNER = CliRunner()
JOB = ["predict", "--frontend", "jax", "--model", "data/strategies/frontend/jax_gpt.py:train_step", "--cluster",
       "local-cpu", "--micro-batch", "4", "--global-batch", "4", "--seq-len", "128", "--precision", "fp32", "--json"]
TREE = "data/strategies/frontend/jax-gpt-tp2-megatron.yaml"
BLOCK_PARAMS, SHED = 789760, 786432 // 2


def _run(*extra: str) -> dict[str, object]:
    result = RUNNER.invoke(app, [*JOB, *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_shipped_tree_splits_attention_and_mlp_and_both_engines_agree() -> None:
    """The tree's paths match (block0's own equations, the residual adds, sit on blocks.0; block0/attn/qkv is
    blocks.0.attn.qkv); both engines give the same figures; the weights are the hand count's."""
    sim, closed = (_run("--num-gpus", "2", "--tp", "2", "--tree", TREE, "--engine", engine)
                   for engine in ("sim", "analytical"))
    whole = _run("--num-gpus", "1", "--engine", "sim")
    assert sim["iteration_time_s"] == pytest.approx(closed["iteration_time_s"], rel=1e-9)
    sim_breakdown, whole_breakdown = sim["breakdown"], whole["breakdown"]
    assert isinstance(sim_breakdown, dict) and isinstance(whole_breakdown, dict)
    assert sim_breakdown["tp_comm"] > 0.0 and whole_breakdown["tp_comm"] == 0.0
    sim_memory, whole_memory = sim["memory_breakdown"], whole["memory_breakdown"]
    assert isinstance(sim_memory, dict) and isinstance(whole_memory, dict)
    assert whole_memory["weights"] == 4 * BLOCK_PARAMS * 4
    assert sim_memory["weights"] == 4 * (BLOCK_PARAMS - SHED) * 4


def test_sequence_parallelism_splits_the_ops_outside_the_split_matmuls() -> None:
    """--sp with the shipped tree (compile.front_end_sequence, as on the torch front-end's graph): both engines
    agree; the weights are the tree's as without sp; the norms, residual adds and loss run on each rank's half of
    the sequence, so compute and activations fall; the all-reduces become all-gathers and reduce-scatters."""
    sim, closed = (_run("--num-gpus", "2", "--tp", "2", "--sp", "--tree", TREE, "--engine", engine)
                   for engine in ("sim", "analytical"))
    plain = _run("--num-gpus", "2", "--tp", "2", "--tree", TREE, "--engine", "sim")
    assert sim["iteration_time_s"] == pytest.approx(closed["iteration_time_s"], rel=1e-9)
    sp_breakdown, breakdown = sim["breakdown"], plain["breakdown"]
    sp_memory, memory = sim["memory_breakdown"], plain["memory_breakdown"]
    assert isinstance(sp_breakdown, dict) and isinstance(breakdown, dict)
    assert isinstance(sp_memory, dict) and isinstance(memory, dict)
    assert sp_memory["weights"] == memory["weights"] == 4 * (BLOCK_PARAMS - SHED) * 4
    assert sp_breakdown["tp_comm"] > 0.0 and sp_breakdown["compute"] < breakdown["compute"]
    assert sp_memory["activations"] < memory["activations"]


@pytest.mark.parametrize(("extra", "words"), [
    (["--num-gpus", "2", "--tp", "2"], "give a strategy tree that splits its ops over tp"),
    (["--num-gpus", "2", "--tp", "2", "--sp", "--seq-len", "127", "--tree", TREE], "seq_len=127 is invalid"),
    (["--num-gpus", "2", "--cp", "2"], "cp=2 is invalid"),
    (["--num-gpus", "2", "--global-batch", "8", "--ep", "2"], "ep=2 is invalid"),
])
def test_bad_input_is_one_line_exit_2(extra: list[str], words: str) -> None:
    result = RUNNER.invoke(app, [*JOB, "--engine", "sim", *extra])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0]
