"""PredTOP's two DAG sources of one stage (sec. IV-B2): the jaxpr (the paper's) and the torch IR (aten ops)
give DAGs of comparable size with the same matrix-product FLOPs, pruned of reshapes and conversions (IV-B4),
and the predictors train on either."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")

from trainsim.frontends.jax.capture import PRUNABLE
from trainsim.ir.model_spec import TransformerSpec
from trainsim.search.predtop.dag import DagBuilder, unit_nodes
from trainsim.search.predtop.experiment import Corpus, dag_builder
from trainsim.search.predtop.jaxdag import JaxDagBuilder, jax_nodes
from trainsim.search.predtop.train import train

MODEL = TransformerSpec(name="tiny", arch="gpt", num_layers=2, hidden=16, ffn_hidden=32, num_heads=2, vocab=64,
                        max_seq_len=8)
MATMULS_TORCH = {"addmm", "mm", "bmm", "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_attention_math"}


@pytest.mark.parametrize(("first", "end"), [(0, 4), (1, 2), (1, 3), (3, 4)])
def test_both_sources_give_comparable_dags_of_the_same_stage(first: int, end: int) -> None:
    torch_dag = DagBuilder(MODEL, 2, 8).stage(first, end)
    jax_dag = JaxDagBuilder(MODEL, 2, 8).stage(first, end)
    # the jaxpr spells out what aten fuses (layer norm, attention): more nodes, of the same order
    assert torch_dag.num_nodes <= jax_dag.num_nodes <= 8 * torch_dag.num_nodes
    assert jax_dag.features.shape[1] == torch_dag.features.shape[1]  # one feature layout: either trains


def test_matrix_product_flops_agree_between_sources() -> None:
    block_torch = unit_nodes(MODEL, 1, 2, 8)
    block_jax = jax_nodes(MODEL, 1, 2, 2, 8)
    torch_flops = sum(n.flops for n in block_torch if n.op in MATMULS_TORCH)
    jax_flops = sum(n.flops for n in block_jax if n.op == "dot_general")
    # per token: q, k, v, o (4 x 2 x 16 x 16), MLP (2 x 2 x 16 x 32), attention (2 x 2 x 8 x 16): exact
    tokens = 2 * 8
    expected = tokens * (4 * 2 * 16 * 16 + 2 * 2 * 16 * 32) + 2 * 2 * (2 * 8 * 8 * 8) * 2
    assert jax_flops == pytest.approx(expected)
    assert torch_flops == pytest.approx(expected)


def test_jax_dag_is_pruned_and_without_parameters() -> None:
    nodes = jax_nodes(MODEL, 0, 4, 2, 8)
    assert not any(n.kind == "operator" and n.op in PRUNABLE - {"transpose", "broadcast_in_dim"} for n in nodes)
    inputs = [n for n in nodes if n.kind == "input"]
    assert len(inputs) == 1 and inputs[0].shape == (2, 8)  # the tokens; the weights are dropped
    assert nodes[-1].kind == "output" and nodes[-1].shape == (2, 8, 64)


def test_the_switch_picks_the_source_and_a_predictor_trains_on_jax_dags() -> None:
    corpus = Corpus(MODEL, 2, 8)
    assert isinstance(dag_builder(corpus, "jax"), JaxDagBuilder)
    assert isinstance(dag_builder(corpus, "torch"), DagBuilder)
    builder = dag_builder(corpus, "jax")
    ranges = [(a, b) for a in range(4) for b in range(a + 1, 5)]
    dags = [builder.stage(a, b) for a, b in ranges]
    ys = [0.01 * (b - a) for a, b in ranges]
    predictor = train("transformer", dags[2:], ys[2:], (dags[:2], ys[:2]), epochs=2, patience=2)
    assert all(v > 0 for v in predictor.predict_s(dags))
