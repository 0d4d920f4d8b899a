"""PredTOP: the stage DAG (composition equals a direct trace; pruning; depth and reachability), the three
predictors train deterministically, the splits of sec. VIII-A."""

import pytest

torch = pytest.importorskip("torch")

from trainsim.ir.model_spec import TransformerSpec  # noqa: E402
from trainsim.measure.stage import build_stage  # noqa: E402
from trainsim.search.predtop.dag import (  # noqa: E402
    COST_FEATURES,
    DIMS,
    NUM_FEATURES,
    OP_VOCAB,
    PRUNED,
    DagBuilder,
    prune,
    record,
    to_dag,
)
from trainsim.search.predtop.models import MODEL_KINDS, make_batch, make_model  # noqa: E402
from trainsim.search.predtop.train import mre_percent, split, train  # noqa: E402

MODEL = TransformerSpec(name="tiny", arch="gpt", num_layers=3, hidden=16, ffn_hidden=32, num_heads=2, vocab=64,
                        max_seq_len=8)
MOE = TransformerSpec(name="tiny-moe", arch="gpt", num_layers=2, hidden=16, ffn_hidden=32, num_heads=2, vocab=64,
                      max_seq_len=8, num_experts=2, top_k=1, moe_every=2)


@pytest.mark.parametrize(("model", "first", "end"), [(MODEL, 0, 5), (MODEL, 1, 4), (MOE, 0, 4), (MOE, 2, 3)])
def test_composed_dag_equals_a_direct_trace(model, first, end):
    composed = DagBuilder(model, 2, 8).stage(first, end)
    inputs = torch.randint(0, model.vocab, (2, 8)) if first == 0 else torch.randn(2, 8, model.hidden)
    direct = to_dag(prune(record(build_stage(model, first, end), inputs)))
    if model is MOE:  # tokens routed to each expert depend on the data: every feature but those shapes agrees
        dims = slice(len(OP_VOCAB) + 1, len(OP_VOCAB) + 1 + DIMS)
        composed.features[:, dims] = direct.features[:, dims] = 0.0
        cost = slice(NUM_FEATURES - COST_FEATURES, NUM_FEATURES - 1)  # FLOPs and bytes follow those shapes
        composed.features[:, cost] = direct.features[:, cost] = 0.0
    assert (composed.features == direct.features).all()
    assert sorted(composed.edges) == sorted(direct.edges)
    assert (composed.depth == direct.depth).all()
    assert (composed.reach == direct.reach).all()


def test_pruned_graph_has_no_views_and_a_chain_reaches_everything():
    nodes = prune(record(build_stage(MODEL, 1, 2), torch.randn(2, 8, 16)))
    assert not any(n.op in PRUNED for n in nodes)
    assert nodes[0].kind == "input" and nodes[-1].kind == "output"
    dag = to_dag(nodes)
    # the input reaches every node and every node reaches the output
    assert dag.reach[0].all() and dag.reach[-1].all()
    assert dag.depth[0] == 0 and dag.depth[-1] == dag.depth.max()
    # a block: two residual adds, two layer norms, six linear layers, attention, gelu
    ops = [n.op for n in nodes]
    assert ops.count("add") == 2 and ops.count("native_layer_norm") == 2 and ops.count("addmm") == 6


def test_splits_of_section_viii_a():
    parts = split(100, 0.3, seed=0)
    assert (len(parts.train), len(parts.validation), len(parts.test)) == (30, 10, 60)
    assert set(parts.train) | set(parts.validation) | set(parts.test) == set(range(100))
    assert split(100, 0.3, seed=0) == parts
    with pytest.raises(ValueError):
        split(100, 0.95, seed=0)


def test_mre():
    assert mre_percent([1.1, 0.9], [1.0, 1.0]) == pytest.approx(10.0)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_predictors_train_deterministically(kind):
    builder = DagBuilder(MODEL, 2, 8)
    ranges = [(a, b) for a in range(5) for b in range(a + 1, 6)]
    dags = [builder.stage(a, b) for a, b in ranges]
    ys = [0.01 * (b - a) + (0.02 if b == 5 else 0.0) for a, b in ranges]
    val = (dags[:3], ys[:3])
    one = train(kind, dags[3:], ys[3:], val, epochs=4, patience=2, seed=1)
    two = train(kind, dags[3:], ys[3:], val, epochs=4, patience=2, seed=1)
    assert one.predict_s(dags) == two.predict_s(dags)
    assert all(v == v for v in one.predict_s(dags))  # no NaN (padded nodes included)


def test_batch_pads_and_masks():
    builder = DagBuilder(MODEL, 2, 8)
    small, large = builder.stage(1, 2), builder.stage(0, 5)
    batch = make_batch([small, large])
    assert batch.mask.sum(1).tolist() == [small.num_nodes, large.num_nodes]
    out = make_model("transformer")(batch)
    alone = make_model("transformer")
    torch.manual_seed(0)
    a = make_model("transformer")
    torch.manual_seed(0)
    b = make_model("transformer")
    # padding does not change a graph's prediction
    assert a(make_batch([small]))[0].item() == pytest.approx(b(batch)[0].item(), rel=1e-5)
    del out, alone
