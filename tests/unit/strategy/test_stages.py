"""The pipeline split (strategy.stages): Megatron-Core's rules where it divides, the torchtitan / DeepSpeed
remainder rule where it does not, the explicit stage list, the refusals, and the in-flight micro-batches of
unequal chunks."""

from typing import Any

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_model
from trainsim.catalog.model_files import parse_model
from trainsim.errors import ConfigError
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stages import in_flight_micro_batches, plan_stages, rank_blocks, split_blocks

# (layers, pp, vpp, first, last, embedding, loss) -> blocks per virtual stage (chunk-major: c * pp + r)
SPLITS: list[tuple[tuple[int, int, int, int, int, bool, bool], tuple[int, ...]]] = [
    ((8, 2, 1, 0, 0, False, False), (4, 4)),
    ((8, 2, 2, 0, 0, False, False), (2, 2, 2, 2)),
    # Megatron-Core, transformer_block.py get_num_layers_to_build: uneven first / last stages
    ((16, 4, 1, 3, 3, False, False), (3, 5, 5, 3)),
    ((16, 4, 1, 2, 0, False, False), (2, 5, 5, 4)),
    ((16, 4, 1, 0, 7, False, False), (3, 3, 3, 7)),
    ((10, 2, 1, 4, 6, False, False), (4, 6)),
    ((32, 4, 2, 6, 6, False, False), (3, 5, 5, 3, 3, 5, 5, 3)),
    # embedding and loss counted as layers: one block fewer on the first / last virtual stage
    ((126, 8, 4, 0, 0, True, True), (3,) + (4,) * 30 + (3,)),
    ((14, 4, 1, 0, 0, True, True), (3, 4, 4, 3)),
    ((15, 4, 1, 0, 0, True, False), (3, 4, 4, 4)),
    ((15, 4, 1, 0, 0, False, True), (4, 4, 4, 3)),
    ((6, 4, 2, 0, 0, True, True), (0, 1, 1, 1, 1, 1, 1, 0)),
    # remainders: one more on the first virtual stages (torchtitan, DeepSpeed)
    ((30, 4, 1, 0, 0, False, False), (8, 8, 7, 7)),
    ((30, 4, 2, 0, 0, False, False), (4, 4, 4, 4, 4, 4, 3, 3)),
    ((13, 4, 1, 0, 0, True, True), (3, 4, 4, 2)),
    ((2, 4, 1, 0, 0, True, True), (0, 1, 1, 0)),
    ((17, 4, 1, 3, 3, False, False), (3, 6, 5, 3)),
    ((17, 4, 2, 3, 3, False, False), (2, 3, 3, 2, 1, 3, 2, 1)),
]


@pytest.mark.parametrize(("settings", "expected"), SPLITS)
def test_split_blocks(settings: tuple[int, int, int, int, int, bool, bool], expected: tuple[int, ...]) -> None:
    layers, pp, vpp, first, last, embedding, loss = settings
    got = split_blocks(layers, pp, vpp, first=first, last=last, embedding=embedding, loss=loss)
    assert got == expected
    assert sum(got) == layers


def test_explicit_lists_per_rank_and_per_virtual_stage() -> None:
    assert split_blocks(126, 8, explicit=[15, 16, 16, 16, 16, 16, 16, 15]) == (15, 16, 16, 16, 16, 16, 16, 15)
    # per rank, each rank's blocks dealt over its chunks (the first chunks one more)
    assert split_blocks(14, 2, 2, explicit=[5, 9]) == (3, 5, 2, 4)
    # per virtual stage, as given
    assert split_blocks(14, 2, 2, explicit=[3, 4, 4, 3]) == (3, 4, 4, 3)


BAD_SPLITS: list[tuple[dict[str, Any], str]] = [
    ({"layers": 10, "pp": 2, "explicit": [4, 5]}, "sums to 9; must equal the model's 10"),
    ({"layers": 10, "pp": 4, "explicit": [4, 6]}, "has 2 entries; allowed: 4 entries"),
    ({"layers": 10, "pp": 3, "explicit": [5, 0, 5]}, "leaves virtual stage 1"),
    ({"layers": 10, "pp": 4, "first": 6, "last": 4}, "leaves 0 of the 10 layers for 2 middle stages"),
    ({"layers": 10, "pp": 2, "first": 6, "last": 6}, "first_stage_layers=6 is invalid"),
    ({"layers": 10, "pp": 2, "first": 3, "embedding": True}, "cannot be combined with embedding_in_split"),
    ({"layers": 4, "pp": 4, "vpp": 2}, "leaves virtual stage 4"),
    ({"layers": 1, "pp": 4, "embedding": True, "loss": True}, "4 virtual stages need at least 4 layers"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SPLITS)
def test_bad_splits_are_one_line_errors(args: dict[str, Any], message: str) -> None:
    args = dict(args)
    layers, pp, vpp = args.pop("layers"), args.pop("pp"), args.pop("vpp", 1)
    with pytest.raises(ConfigError) as caught:
        split_blocks(layers, pp, vpp, **args)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


BAD_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"pp": 2, "stage_layers": "4,x"}, "stage_layers='4,x' is invalid: must be comma-separated non-negative"),
    ({"pp": 2, "stage_layers": [4, -1]}, "must be non-negative integers"),
    ({"pp": 2, "stage_layers": [4, True]}, "not true or false"),
    ({"pp": 4, "stage_layers": "4,4"}, "stage_layers has 2 entries; allowed: pp=4"),
    ({"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "stage_layers": "1,2,3"},
     "stage_layers has 3 entries; allowed: pp=2 or pp x vpp=4"),
    ({"pp": 1, "first_stage_layers": 2}, "need pp > 1"),
    ({"pp": 2, "first_stage_layers": 2, "loss_in_split": True}, "cannot be combined"),
    ({"pp": 2, "stage_layers": "2,2", "embedding_in_split": True}, "stage_layers lists every stage"),
    ({"pp": 2, "last_stage_layers": -1}, "last_stage_layers=-1 is invalid"),
]


@pytest.mark.parametrize(("data", "message"), BAD_SPECS)
def test_bad_split_settings_are_refused_by_the_strategy(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ParallelSpec.parse(data)
    assert message in str(caught.value)


def test_stage_layers_parse_from_text_and_lists() -> None:
    assert ParallelSpec.parse({"pp": 3, "stage_layers": "4, 5,6"}).stage_layers == (4, 5, 6)
    assert ParallelSpec.parse({"pp": 3, "stage_layers": [4, 5, 6]}).stage_layers == (4, 5, 6)
    assert ParallelSpec.parse({"pp": 3, "stage_layers": ""}).stage_layers == ()


GPT30 = parse_model({"name": "gpt-30", "num_layers": 30, "hidden": 256, "ffn_hidden": 1024, "num_heads": 4,
                     "vocab": 1024, "max_seq_len": 256})


def test_layers_that_pp_does_not_divide_make_a_job() -> None:
    job = make_job(GPT30, a100_cluster(4), ParallelSpec(pp=4, global_batch=8, seq_len=256))
    assert rank_blocks(30, job.parallel) == (8, 8, 7, 7)
    graph = graph_for(job)
    stages = plan_stages(graph, job.parallel)
    blocks = [sum(part.count for part in stage if part.layer.kind == "block") for stage in stages]
    assert blocks == [8, 8, 7, 7]
    assert stages[0][0].layer.kind == "embedding"
    assert stages[-1][-1].layer.kind == "head"
    plan = default_plan(graph, job.parallel)
    per_stage = [sum(1 for a in plan.layers if a.stage == s and a.layer.kind == "block") for s in range(4)]
    assert per_stage == [8, 8, 7, 7]


def test_a_split_the_model_cannot_take_is_refused_by_make_job() -> None:
    with pytest.raises(ConfigError, match="sums to 31; must equal the model's 30"):
        make_job(GPT30, a100_cluster(4), ParallelSpec(pp=4, global_batch=8, seq_len=256, stage_layers=(8, 8, 8, 7)))
    cnn = load_model("resnet50")
    with pytest.raises(ConfigError, match="apply to transformers"):
        make_job(cnn, a100_cluster(2), ParallelSpec(pp=2, global_batch=8, embedding_in_split=True))


def test_interleaved_plan_places_virtual_stages_chunk_major() -> None:
    par = ParallelSpec(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch=8, seq_len=256, embedding_in_split=True,
                       loss_in_split=True)
    job = make_job(GPT30, a100_cluster(4), par)
    plan = default_plan(graph_for(job), job.parallel)
    per_vs = [0] * 8
    for a in plan.layers:
        if a.layer.kind == "block":
            per_vs[a.chunk * 4 + a.stage] += 1
    assert tuple(per_vs) == split_blocks(30, 4, 2, embedding=True, loss=True) == (3, 4, 4, 4, 4, 4, 4, 3)
    kinds = {a.layer.kind: (a.stage, a.chunk) for a in plan.layers if a.layer.kind in ("embedding", "head")}
    assert kinds == {"embedding": (0, 0), "head": (3, 1)}


def test_in_flight_of_unequal_chunks() -> None:
    # p=2, v=2, stage 0 holds 2 (p - 0 - 1) + (v - 1) p + 1 = 5 chunk steps; step k runs chunk (k // p) mod v:
    # chunks 0, 0, 1, 1, 0 -> 3 of chunk 0 and 2 of chunk 1.
    assert in_flight_micro_batches("interleaved-1f1b", 0, 2, 2, 8) == 2.5
    assert in_flight_micro_batches("interleaved-1f1b", 0, 2, 2, 8, (0.5, 0.5)) == 2.5
    assert in_flight_micro_batches("interleaved-1f1b", 0, 2, 2, 8, (0.25, 0.75)) == 3 * 0.25 + 2 * 0.75
    # stage 1: (v - 1) p + 1 = 3 steps: chunks 0, 0, 1
    assert in_flight_micro_batches("interleaved-1f1b", 1, 2, 2, 8, (0.25, 0.75)) == 2 * 0.25 + 0.75
