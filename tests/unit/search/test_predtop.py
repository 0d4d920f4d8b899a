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
    _Node,
    prune,
    record,
    to_dag,
)
from trainsim.search.predtop.experiment import Corpus, Setting, alpa_layers, with_layers  # noqa: E402
from trainsim.search.predtop.models import (  # noqa: E402
    MODEL_KINDS,
    DagAttentionLayer,
    attention_bias,
    depth_encoding,
    make_batch,
    make_model,
)
from trainsim.search.predtop.train import (  # noqa: E402
    _batches,
    batch_size,
    flat_parameters,
    mre_percent,
    split,
    train,
)
from trainsim.strategy.stage_plan import IntraPlan, Mesh  # noqa: E402

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


def test_batch_size_fixed_or_four_steps_an_epoch():
    assert batch_size(83) == 21 and batch_size(200) == 32 and batch_size(83, 32) == 32
    builder = DagBuilder(MODEL, 2, 8)
    dags = [builder.stage(a, b) for a in range(5) for b in range(a + 1, 6)]  # 15 graphs
    sizes = [len(y) for _, y in _batches(dags, torch.ones(len(dags)), "cpu", 6)]
    assert sorted(sizes) == [3, 6, 6]


def test_on_epoch_sees_every_epoch_and_the_validation_loss():
    builder = DagBuilder(MODEL, 2, 8)
    ranges = [(a, b) for a in range(5) for b in range(a + 1, 6)]
    dags = [builder.stage(a, b) for a, b in ranges]
    ys = [0.01 * (b - a) for a, b in ranges]
    seen: list[tuple[int, float]] = []
    predictor = train("gcn", dags[3:], ys[3:], (dags[:3], ys[:3]), epochs=5, patience=5, seed=0,
                      on_epoch=lambda epoch, loss, model: seen.append((epoch, loss)))
    assert [e for e, _ in seen] == list(range(predictor.epochs_run))
    assert min(loss for _, loss in seen) == predictor.best_validation_loss


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


def _node(kind: str, preds: list[int]) -> _Node:
    return _Node("add" if kind == "operator" else kind, kind, (2, 3), "float32", preds)


def test_reachability_mask_of_a_hand_made_dag():
    """Eq. 1 with k = infinity: a node attends to itself, its ancestors and its descendants, never to a sibling.
    The DAG: input 0 -> 1 and 2 (siblings), both -> 3 -> output 4."""
    dag = to_dag([_node("input", []), _node("operator", [0]), _node("operator", [0]), _node("operator", [1, 2]),
                  _node("output", [3])])
    expected = [[1, 1, 1, 1, 1],
                [1, 1, 0, 1, 1],
                [1, 0, 1, 1, 1],
                [1, 1, 1, 1, 1],
                [1, 1, 1, 1, 1]]
    assert dag.reach.astype(int).tolist() == expected
    assert dag.depth.tolist() == [0, 1, 1, 2, 3]
    assert sorted(dag.edges) == [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]


def test_reachability_mask_with_a_second_source():
    """A source other than the input (3, an arange feeding 4) reaches 4 and 5 only; 1 and 2 do not see it."""
    nodes = [_node("input", []), _node("operator", [0]), _node("operator", [0]), _node("operator", []),
             _node("operator", [1, 2, 3]), _node("output", [4])]
    dag = to_dag(nodes)
    assert dag.reach[3].astype(int).tolist() == [0, 0, 0, 1, 1, 1]
    assert dag.reach[:, 3].astype(int).tolist() == [0, 0, 0, 1, 1, 1]
    assert not dag.reach[1, 2] and not dag.reach[2, 1]
    assert (dag.reach == dag.reach.T).all()
    assert dag.depth.tolist() == [0, 1, 1, 0, 2, 3]


def test_masked_attention_is_equation_1():
    """The layer's attention is softmax(QK^T / sqrt(d_k) + M) V with M = -inf off the reachable set: the same as
    the formula written out, and a node's output does not change when an unreachable node's features do."""
    torch.manual_seed(0)
    layer = DagAttentionLayer(8, 2).eval()
    x = torch.randn(1, 4, 8)
    reach = torch.tensor([[[1, 1, 1, 1], [1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 1]]], dtype=torch.bool)
    q, k, v = layer.qkv(x).view(1, 4, 3, 2, 4).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~reach[:, None], float("-inf"))
    attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(1, 4, 8)
    h = layer.norm1(x + layer.out(attended))
    manual = layer.norm2(h + layer.ffn(h))
    bias = attention_bias(reach)
    with torch.no_grad():
        assert torch.allclose(layer(x, bias), manual, atol=1e-6)
        moved = x.clone()
        moved[0, 2] += 5.0  # node 2 is not reachable from node 1
        assert torch.allclose(layer(moved, bias)[0, 1], layer(x, bias)[0, 1], atol=1e-6)
        assert not torch.allclose(layer(moved, bias)[0, 0], layer(x, bias)[0, 0], atol=1e-3)


def test_attention_bias_exact():
    """Eq. 1's M for a 3-node chain 0 -> 1 and a lone node 2: 0 on the reachable pairs, -inf elsewhere, one
    [B, 1, N, N] for all heads."""
    reach = torch.tensor([[[1, 1, 0], [1, 1, 0], [0, 0, 1]]], dtype=torch.bool)
    inf = float("-inf")
    assert attention_bias(reach).tolist() == [[[[0.0, 0.0, inf], [0.0, 0.0, inf], [inf, inf, 0.0]]]]


def test_attention_bias_gives_the_boolean_masks_attention_bit_for_bit():
    """The bias made once per batch and the boolean mask torch converts on every call give the same layer output,
    forward and gradients, to the bit (the fits are unchanged by building it once)."""
    torch.manual_seed(1)
    layer = DagAttentionLayer(8, 2)
    reach = torch.rand(3, 5, 5) < 0.5
    reach |= torch.eye(5, dtype=torch.bool)
    x = torch.randn(3, 5, 8, requires_grad=True)
    outputs = []
    for mask in (reach[:, None], attention_bias(reach)):
        layer.zero_grad()
        x.grad = None
        out = layer(x, mask)
        out.square().sum().backward()
        assert x.grad is not None and layer.qkv.weight.grad is not None
        outputs.append((out.detach(), x.grad.clone(), layer.qkv.weight.grad.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))


def test_flat_parameters_are_views_and_keep_the_values():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    before = [p.detach().clone() for p in model.parameters()]
    flat = flat_parameters(model)
    assert flat.shape == (3 * 2 + 2 + 2 * 1 + 1,) and flat.is_leaf and flat.requires_grad
    assert torch.equal(flat.detach(), torch.cat([b.reshape(-1) for b in before]))
    with torch.no_grad():
        flat[0] = 7.0
        flat.grad[-1] = 5.0  # type: ignore[index]
    assert model[0].weight[0, 0].item() == 7.0
    assert model[1].bias.grad is not None and model[1].bias.grad.tolist() == [5.0]


def test_adam_on_flat_parameters_equals_adam_per_parameter_bit_for_bit():
    """Three steps of Adam on the DAG Transformer, per parameter tensor (torch's default on a CPU) and on the flat
    tensor with gradients accumulated into its views: the same weights to the bit."""
    builder = DagBuilder(MODEL, 2, 8)
    batch = make_batch([builder.stage(1, 2), builder.stage(0, 3)])
    weights = []
    for flat in (False, True):
        torch.manual_seed(0)
        model = make_model("transformer")
        params = [flat_parameters(model)] if flat else list(model.parameters())
        optimizer = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), foreach=False)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=not flat)
            model(batch).square().sum().backward()
            optimizer.step()
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))
    torch.manual_seed(0)
    initial = [p.detach() for p in make_model("transformer").parameters()]
    assert not any(torch.equal(a, b) for a, b in zip(initial, weights[1], strict=True))  # every tensor was updated


def test_flat_parameters_refuses_mixed_dtypes():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="dtype or device"):
        flat_parameters(model)


def test_batch_depth_code_is_made_once():
    builder = DagBuilder(MODEL, 2, 8)
    batch = make_batch([builder.stage(1, 2), builder.stage(0, 3)])
    code = batch.depth_code(8)
    assert torch.equal(code, depth_encoding(batch.depth, 8))
    assert batch.depth_code(8) is code
    assert batch.depth_code(4).shape == (2, batch.depth.shape[1], 4)


def test_alpa_layers_exact():
    """Alpa's rule: a layer holds 3 or more heavy ops unless its FLOPs reach 1.5 x the average unit's."""
    # embedding (no heavy op) joins block 0; a head of 40 FLOPs >= 1.5 x 60 / 4 = 22.5 stands alone
    assert alpa_layers([0, 10, 10, 40], [0, 7, 7, 1]) == (0, 2, 3, 4)
    # a head of 5 FLOPs < 1.5 x 25 / 4 with one heavy op joins the last block
    assert alpa_layers([0, 10, 10, 5], [0, 7, 7, 1]) == (0, 2, 4)
    # nothing meets the rule: one layer
    assert alpa_layers([1, 1], [0, 0]) == (0, 2)
    assert alpa_layers([5], [7]) == (0, 1)
    with pytest.raises(ValueError):
        alpa_layers([], [])


def test_stages_of_clustered_layers():
    setting = Setting(Mesh(1, 1), IntraPlan())
    corpus = Corpus(MODEL, 2, 8, boundaries=(0, 2, 3, 5))
    ranges = [(s.first, s.end) for s in corpus.stages(setting)]
    assert ranges == [(0, 2), (0, 3), (0, 5), (2, 3), (2, 5), (3, 5)]
    assert len(Corpus(MODEL, 2, 8).stages(setting)) == 15  # 5 units: every range
    clustered = with_layers(Corpus(MODEL, 2, 8), "alpa")
    assert clustered.boundaries is not None and clustered.boundaries[:2] == (0, 2)  # the embedding joins block 0
    assert clustered.boundaries[-1] == 5
    assert with_layers(clustered, "units").boundaries is None
