"""PredTOP's stage-latency predictors in plain torch, on batches of padded DAGs.

- DagTransformer (sec. IV-A/IV-B5, after Luo et al. 2023, "Transformers over directed acyclic graphs"):
  node features -> 64, plus a sinusoidal encoding of the node's depth (DAGPE); 4 layers of multi-head
  self-attention masked to the node's reachable set (DAGRA, eq. 1, k = infinity) with a feed-forward block,
  residuals and layer norms; global add pooling (eq. 2); linear layers with ReLU; one output.
- Gcn (sec. VII-D): 6 graph-convolution layers of 256 (Kipf and Welling 2017: D^-1/2 (A + I) D^-1/2 over the
  undirected graph), add pooling, the same head.
- Gat (sec. VII-D): 6 graph-attention layers of hidden size 32 (Velickovic et al. 2018; 4 heads of 8), over
  each node's neighbours and itself, add pooling, the same head.
torch-geometric is not needed: graphs of a few hundred nodes are batched as padded tensors. GCN and GAT
aggregate over the batch's edge list (Batch.edges: the nonzeros of the padded adjacency, self loops included),
as torch-geometric's message passing does: the same sums as the dense N x N products, at the cost of the
edges (a stage's DAG has about two per node) instead of N^2 per graph.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from trainsim.search.predtop.dag import NUM_FEATURES, StageDag

MODEL_KINDS = ("transformer", "gcn", "gat")


@dataclass(frozen=True, slots=True)
class Batch:
    """Padded DAGs, built once per batch of graphs and reused every epoch: the attention bias and the depth
    encodings (constants of the batch) are made here, not in every forward."""

    features: torch.Tensor  # [B, N, F]
    mask: torch.Tensor  # [B, N] real nodes
    adjacency: torch.Tensor  # [B, N, N] undirected edges + self loops
    depth: torch.Tensor  # [B, N]
    attention_bias: torch.Tensor  # [B, 1, N, N] eq. 1's M from reachability: 0 where reach, -inf elsewhere
    _depth_codes: dict[int, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)
    _edges: list["Edges"] = field(default_factory=list, compare=False, repr=False)

    def to(self, device: str) -> "Batch":
        if device == "cpu":
            return self
        return Batch(self.features.to(device), self.mask.to(device), self.adjacency.to(device),
                     self.depth.to(device), self.attention_bias.to(device))

    def depth_code(self, width: int) -> torch.Tensor:
        """depth_encoding(depth, width), computed on the first call and kept (no gradient flows into it)."""
        if width not in self._depth_codes:
            self._depth_codes[width] = depth_encoding(self.depth, width)
        return self._depth_codes[width]

    @property
    def edges(self) -> "Edges":
        """The adjacency's nonzeros as flat node indices (made on the first call and kept)."""
        if not self._edges:
            self._edges.append(edge_list(self.adjacency))
        return self._edges[0]


@dataclass(frozen=True, slots=True)
class Edges:
    """The nonzeros (b, i, j) of a batch's padded adjacency [B, N, N] as indices into its B * N nodes: node
    i of graph b is b * N + i. Every padded node has its self loop, so every node has an edge."""

    dst: torch.Tensor  # [E] b * N + i: the node that aggregates
    src: torch.Tensor  # [E] b * N + j: its neighbour (or itself)
    weight: torch.Tensor  # [E] the adjacency's entry
    nodes: int  # B * N


def edge_list(adjacency: torch.Tensor) -> Edges:
    b, n, _ = adjacency.shape
    graph, i, j = adjacency.nonzero(as_tuple=True)
    return Edges(graph * n + i, graph * n + j, adjacency[graph, i, j], b * n)


def _aggregate(values: torch.Tensor, edges: Edges) -> torch.Tensor:
    """out[dst] = sum over the edges into dst of values [E, ...] (index_add: a scatter sum)."""
    out = values.new_zeros((edges.nodes, *values.shape[1:]))
    return out.index_add(0, edges.dst, values)


def attention_bias(reach: torch.Tensor) -> torch.Tensor:
    """Eq. 1's additive mask M for reachability `reach` [B, N, N]: [B, 1, N, N] (one for all heads), 0 where
    reach, -inf elsewhere: what scaled_dot_product_attention makes of a boolean mask on every call (torch
    2.x, convert_boolean_attn_mask), made once per batch."""
    return torch.where(reach[:, None].logical_not(), float("-inf"), 0.0)


def make_batch(dags: list[StageDag]) -> Batch:
    n = max(dag.num_nodes for dag in dags)
    b = len(dags)
    features = np.zeros((b, n, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((b, n), dtype=bool)
    reach = np.zeros((b, n, n), dtype=bool)
    adjacency = np.zeros((b, n, n), dtype=np.float32)
    depth = np.zeros((b, n), dtype=np.int64)
    for i, dag in enumerate(dags):
        k = dag.num_nodes
        features[i, :k] = dag.features
        mask[i, :k] = True
        reach[i, :k, :k] = dag.reach
        depth[i, :k] = dag.depth
        for src, dst in dag.edges:
            adjacency[i, src, dst] = adjacency[i, dst, src] = 1.0
        adjacency[i, np.arange(k), np.arange(k)] = 1.0
    for i in range(b):  # padded nodes see themselves only (their output is masked out of the pooling)
        pad = np.arange(dags[i].num_nodes, n)
        reach[i, pad, pad] = True
        adjacency[i, pad, pad] = 1.0
    return Batch(torch.from_numpy(features), torch.from_numpy(mask), torch.from_numpy(adjacency),
                 torch.from_numpy(depth), attention_bias(torch.from_numpy(reach)))


def _pool(x: torch.Tensor, batch: Batch, scale: torch.Tensor) -> torch.Tensor:
    """Global add pooling (eq. 2), times a constant (the inverse of the training graphs' mean node count, set
    by train.prepare) so that the head sees sums of order one; the sum stays additive over the nodes."""
    return (x * batch.mask[..., None]).sum(dim=1) * scale


def _head(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


def depth_encoding(depth: torch.Tensor, width: int) -> torch.Tensor:
    """Sinusoidal positional encoding (Vaswani et al. 2017) of each node's depth."""
    half = width // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=depth.device) / half)
    angles = depth.to(torch.float32)[..., None] * freq
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class DagAttentionLayer(nn.Module):
    """Multi-head self-attention restricted to the reachable set (eq. 1), then a feed-forward block; residuals
    and post-norms as the Transformer (Vaswani et al. 2017). Written out (not nn.TransformerEncoderLayer, whose
    inference fast path gave predictions unlike the training path's under this mask); the masked attention is
    torch's scaled_dot_product_attention (the same in training and inference, no dropout)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.ffn = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
        self.norm1 = nn.LayerNorm(width)
        self.norm2 = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x [B, N, width]; bias [B, 1, N, N]: attention_bias(reach) (or the boolean reach[:, None])."""
        b, n, w = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        # softmax(QK^T / sqrt(d_k) + M) V with M = 0 where reach, -inf elsewhere (eq. 1), in one fused kernel
        attended = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        attended = attended.transpose(1, 2).reshape(b, n, w)
        x = self.norm1(x + self.out(attended))
        return self.norm2(x + self.ffn(x))


class DagTransformer(nn.Module):
    pool_scale: torch.Tensor

    def __init__(self, width: int = 64, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.width = width
        self.embed = nn.Linear(NUM_FEATURES, width)
        self.layers = nn.ModuleList(DagAttentionLayer(width, heads) for _ in range(layers))
        self.head = _head(width)
        self.register_buffer("pool_scale", torch.tensor(1.0))

    def forward(self, batch: Batch) -> torch.Tensor:
        x = self.embed(batch.features) + batch.depth_code(self.width)
        for layer in self.layers:
            x = layer(x, batch.attention_bias)
        return self.head(_pool(x, batch, self.pool_scale)).squeeze(-1)


class Gcn(nn.Module):
    pool_scale: torch.Tensor

    def __init__(self, width: int = 256, layers: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(NUM_FEATURES if i == 0 else width, width) for i in range(layers))
        self.head = _head(width)
        self.register_buffer("pool_scale", torch.tensor(1.0))

    def forward(self, batch: Batch) -> torch.Tensor:
        b, n, _ = batch.features.shape
        edges = batch.edges
        inv = batch.adjacency.sum(-1).clamp(min=1.0).rsqrt().reshape(-1)
        norm = (inv[edges.dst] * edges.weight * inv[edges.src])[:, None]  # D^-1/2 (A + I) D^-1/2 per edge
        x = batch.features
        for layer in self.layers:
            h = layer(x).reshape(b * n, -1)
            x = torch.relu(_aggregate(norm * h[edges.src], edges)).view(b, n, -1)
        return self.head(_pool(x, batch, self.pool_scale)).squeeze(-1)


class GatLayer(nn.Module):
    def __init__(self, width_in: int, heads: int, per_head: int) -> None:
        super().__init__()
        self.heads, self.per_head = heads, per_head
        self.proj = nn.Linear(width_in, heads * per_head, bias=False)
        self.src = nn.Parameter(torch.empty(heads, per_head))
        self.dst = nn.Parameter(torch.empty(heads, per_head))
        nn.init.xavier_uniform_(self.src)
        nn.init.xavier_uniform_(self.dst)

    def forward(self, x: torch.Tensor, edges: Edges) -> torch.Tensor:
        b, n, _ = x.shape
        h = self.proj(x).view(b * n, self.heads, self.per_head)
        score_src = (h * self.src).sum(-1)  # [B * N, H]
        score_dst = (h * self.dst).sum(-1)
        scores = nn.functional.leaky_relu(score_dst[edges.dst] + score_src[edges.src], 0.2)  # [E, H]
        # softmax over each node's neighbours (and itself), shifted by its largest score (no gradient: the
        # softmax does not depend on the shift)
        with torch.no_grad():
            peak = scores.new_full((edges.nodes, self.heads), float("-inf"))
            peak = peak.scatter_reduce(0, edges.dst[:, None].expand_as(scores), scores, "amax")
        exp = torch.exp(scores - peak[edges.dst])
        weights = exp / _aggregate(exp, edges)[edges.dst]
        out = _aggregate(weights[..., None] * h[edges.src], edges)
        return nn.functional.elu(out.reshape(b, n, self.heads * self.per_head))


class Gat(nn.Module):
    pool_scale: torch.Tensor

    def __init__(self, width: int = 32, layers: int = 6, heads: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(GatLayer(NUM_FEATURES if i == 0 else width, heads, width // heads)
                                    for i in range(layers))
        self.head = _head(width)
        self.register_buffer("pool_scale", torch.tensor(1.0))

    def forward(self, batch: Batch) -> torch.Tensor:
        x = batch.features
        for layer in self.layers:
            x = layer(x, batch.edges)
        return self.head(_pool(x, batch, self.pool_scale)).squeeze(-1)


def make_model(kind: str) -> nn.Module:
    if kind == "transformer":
        return DagTransformer()
    if kind == "gcn":
        return Gcn()
    if kind == "gat":
        return Gat()
    raise ValueError(kind)
