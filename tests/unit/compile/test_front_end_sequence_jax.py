"""Sequence parallelism on the JAX front-end's jaxpr (compile.front_end_sequence, the torch front-end's pass):
the shipped JAX train step (data/strategies/frontend/jax_gpt.py: 4 pre-norm GPT blocks, hidden 256, 4 heads, ffn
1024, tanh GELU, causal attention as einsums, fp32) against a torch mirror of it (nn.LayerNorm, nn.Linear, the same
einsums, a ModuleList "blocks"), both split by the shipped tree (jax-gpt-tp2-megatron.yaml: qkv and fc1 by out,
proj and fc2 by reduce) at tp 2, micro-batch 2 x 16 tokens.

By hand, per block: without sp an attn.ar and an mlp.ar all-reduce forward and backward; under sp an all-gather of
the block's input before qkv (attn.ag) and of the second norm's output before fc1 (mlp.ag), a reduce-scatter of
proj's and fc2's partial sums (attn.rs, mlp.rs) forward and the four conjugates backward; every buffer the whole
hidden state, 2 x 16 x 256 x 4 = 32768 bytes. The loss's layer (its unscoped equations; the torch capture's head)
pays none. Both front-ends give exactly these (name, kind, phase, bytes, group, column input).
"""

from typing import Any

import pytest

from trainsim.catalog import load_cluster
from trainsim.compile.shape_layers import shape_layers
from trainsim.frontends.opaque import opaque_spec
from trainsim.ir.graph import Comm, OpGraph
from trainsim.job import Job, make_job
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.tree_yaml import load_tree_yaml

pytest.importorskip("jax")
pytest.importorskip("networkx")
torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from trainsim.frontends.jax.capture import graph_from_jax_target  # noqa: E402
from trainsim.frontends.torch.capture import TensorSpec, graph_from_module  # noqa: E402

SOURCE = "data/strategies/frontend/jax_gpt.py:train_step"
TREE = "data/strategies/frontend/jax-gpt-tp2-megatron.yaml"
BATCH, SEQ, HIDDEN, HEADS, FFN, BLOCKS = 2, 16, 256, 4, 1024, 4  # jax_gpt.py's model at 2 x 16 tokens
STATE_BYTES = BATCH * SEQ * HIDDEN * 4  # 32768


def _expected(sp: bool) -> list[tuple[str, str, str, float, int, bool]]:
    """Per block (sorted as _keys): module doc."""
    if not sp:
        return sorted((f"{part}.ar", "all-reduce", phase, STATE_BYTES, 0, phase == "bwd")
                      for part in ("attn", "mlp") for phase in ("fwd", "bwd"))
    return sorted((f"{part}.{kind}", collective, phase, STATE_BYTES, 0, (kind == "ag") == (phase == "fwd"))
                  for part in ("attn", "mlp") for kind, collective in (("ag", "all-gather"), ("rs", "reduce-scatter"))
                  for phase in ("fwd", "bwd"))


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: Any) -> Any:
        head_dim = HIDDEN // HEADS
        q, k, v = (t.reshape(BATCH, SEQ, HEADS, head_dim) for t in self.qkv(x).split(HIDDEN, dim=-1))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / head_dim**0.5
        scores = scores.masked_fill(~torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)), -1e9)
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(BATCH, SEQ, HIDDEN)
        return self.proj(out)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(HIDDEN, FFN), nn.GELU("tanh"), nn.Linear(FFN, HIDDEN)

    def forward(self, x: Any) -> Any:
        return self.fc2(self.act(self.fc1(x)))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(HIDDEN), _Attention(), nn.LayerNorm(HIDDEN), _Mlp()

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(BLOCKS)])

    def forward(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return x


def _loss(y: Any) -> Any:
    return torch.mean(y**2)


@pytest.fixture(scope="module")
def both() -> tuple[OpGraph, OpGraph]:
    jaxpr = graph_from_jax_target(SOURCE, micro_batch=BATCH, seq_len=SEQ, precision="fp32")
    captured = graph_from_module(_Gpt(), [TensorSpec((BATCH, SEQ, HIDDEN))], loss_fn=_loss, fused=True)
    return jaxpr, captured


def _job(sp: bool) -> Job:
    par = ParallelSpec.parse({"micro_batch": BATCH, "seq_len": SEQ, "global_batch": BATCH, "tp": 2, "dp": 1,
                              "precision": "fp32", "sp": sp})
    spec = opaque_spec("train_step", "jax train step", split_by_tree=True)  # as the JAX front-end gives it
    return make_job(spec, load_cluster("local-cpu").with_num_gpus(2), par)


def _keys(comms: tuple[Comm, ...]) -> list[tuple[str, str, str, float, int, bool]]:
    return sorted((c.name, c.collective, c.phase, c.buffer_bytes, c.ranks, bool(c.column_input)) for c in comms)


@pytest.mark.parametrize("sp", [False, True])
def test_the_shipped_jax_gpt_pays_its_torch_mirrors_collectives(both: tuple[OpGraph, OpGraph], sp: bool) -> None:
    jaxpr, captured = both
    job = _job(sp)
    ours = shape_layers(job, load_tree_yaml(TREE, jaxpr).lower(job.parallel)).layers
    theirs = shape_layers(job, load_tree_yaml(TREE, captured).lower(job.parallel)).layers
    assert [a.layer.kind for a in ours] == ["block"] * (BLOCKS + 1)  # the loss's layer: unscoped equations
    assert [a.layer.kind for a in theirs] == ["block"] * BLOCKS + ["head"]
    for mine, other in zip(ours, theirs, strict=True):
        assert _keys(mine.layer.comms) == _keys(other.layer.comms)
        assert _keys(mine.layer.comms) == (_expected(sp) if other.layer.kind == "block" else [])
