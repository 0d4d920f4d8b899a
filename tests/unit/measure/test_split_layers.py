"""`trainsim measure` builds the strategy's pipeline split: contiguous layer ranges per virtual stage."""

import pytest

from conftest import MEASURED_GPT
from trainsim.catalog.model_files import parse_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stages import virtual_stage_blocks


def test_chunks_follow_an_uneven_split() -> None:
    pytest.importorskip("torch")
    from trainsim.measure.model import ChunkPlan, split_layers

    par = ParallelSpec(pp=2, vpp=2, schedule="interleaved-1f1b", embedding_in_split=True, loss_in_split=True)
    blocks = virtual_stage_blocks(6, par)  # 6 + 2 = 8 over 4: 1, 2, 2, 1
    assert split_layers(6, 4, blocks) == [ChunkPlan(0, 1, True, False), ChunkPlan(1, 3, False, False),
                                          ChunkPlan(3, 5, False, False), ChunkPlan(5, 6, False, True)]
    assert split_layers(4, 2) == [ChunkPlan(0, 2, True, False), ChunkPlan(2, 4, False, True)]


def test_the_pipeline_chunks_of_an_uneven_split_compute_the_whole_model() -> None:
    torch = pytest.importorskip("torch")
    from trainsim.measure.model import build_chunk, build_model, split_layers

    spec = parse_model({**MEASURED_GPT, "num_layers": 5})
    assert isinstance(spec, TransformerSpec)
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    whole = build_model(spec, seed=3)(tokens)
    x = tokens
    for plan in split_layers(5, 2, virtual_stage_blocks(5, ParallelSpec(pp=2))):  # 3 + 2 layers
        x = build_chunk(spec, plan, seed=3)(x)
    torch.testing.assert_close(x, whole)
