"""PredTOP's GCN and GAT baselines aggregate over the batch's edge list; each layer equals the dense N x N form
it replaced (Kipf and Welling 2017: D^-1/2 (A + I) D^-1/2 X W; Velickovic et al. 2018: softmax over each node's
neighbours and itself), written out here, on padded batches of real stage DAGs."""

import pytest

torch = pytest.importorskip("torch")

from trainsim.ir.model_spec import TransformerSpec  # noqa: E402
from trainsim.search.predtop.dag import DagBuilder  # noqa: E402
from trainsim.search.predtop.models import Gat, Gcn, _pool, edge_list, make_batch  # noqa: E402

MODEL = TransformerSpec(name="tiny", arch="gpt", num_layers=3, hidden=16, ffn_hidden=32, num_heads=2, vocab=64,
                        max_seq_len=8)


def _batch():
    builder = DagBuilder(MODEL, 2, 8)
    return make_batch([builder.stage(1, 2), builder.stage(0, 5), builder.stage(2, 4)])


def _dense_gcn(model, batch):
    a = batch.adjacency
    inv = a.sum(-1).clamp(min=1.0).rsqrt()
    norm = inv[..., :, None] * a * inv[..., None, :]
    x = batch.features
    for layer in model.layers:
        x = torch.relu(norm @ layer(x))
    return x


def _dense_gat_layer(layer, x, adjacency):
    b, n, _ = x.shape
    h = layer.proj(x).view(b, n, layer.heads, layer.per_head)
    score_src = (h * layer.src).sum(-1)
    score_dst = (h * layer.dst).sum(-1)
    scores = torch.nn.functional.leaky_relu(score_dst[:, :, None, :] + score_src[:, None, :, :], 0.2)
    scores = scores.masked_fill(adjacency[..., None] == 0, float("-inf"))
    weights = torch.softmax(scores, dim=2)
    out = torch.einsum("bijh,bjhd->bihd", weights, h)
    return torch.nn.functional.elu(out.reshape(b, n, layer.heads * layer.per_head))


def test_edge_list_holds_every_nonzero_once():
    batch = _batch()
    edges = edge_list(batch.adjacency)
    b, n, _ = batch.adjacency.shape
    assert edges.nodes == b * n
    assert len(edges.dst) == int((batch.adjacency != 0).sum())
    rebuilt = torch.zeros(b * n, b * n)
    rebuilt[edges.dst, edges.src] = edges.weight
    assert torch.equal(torch.block_diag(*batch.adjacency), rebuilt)
    assert batch.edges is batch.edges  # made once per batch


def test_gcn_on_edges_equals_the_dense_product():
    torch.manual_seed(0)
    model, batch = Gcn(), _batch()
    dense = model.head(_pool(_dense_gcn(model, batch), batch, model.pool_scale)).squeeze(-1)
    torch.testing.assert_close(model(batch), dense, rtol=1e-5, atol=1e-5)


def test_gat_layer_on_edges_equals_the_dense_softmax():
    torch.manual_seed(0)
    model, batch = Gat(), _batch()
    x_edges = x_dense = batch.features
    for layer in model.layers:
        x_edges = layer(x_edges, batch.edges)
        x_dense = _dense_gat_layer(layer, x_dense, batch.adjacency)
        torch.testing.assert_close(x_edges, x_dense, rtol=1e-5, atol=1e-5)


def test_gat_gradients_equal_the_dense_forms():
    torch.manual_seed(0)
    model, batch = Gat(), _batch()
    layer = model.layers[0]
    params = list(layer.parameters())
    on_edges = torch.autograd.grad(layer(batch.features, batch.edges).square().sum(), params)
    dense = torch.autograd.grad(_dense_gat_layer(layer, batch.features, batch.adjacency).square().sum(), params)
    for mine, theirs in zip(on_edges, dense, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
