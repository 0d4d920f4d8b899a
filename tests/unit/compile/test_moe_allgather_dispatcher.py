"""Megatron-Core's all-gather token dispatcher (MoEAllGatherTokenDispatcher, megatron/core/transformer/moe/
token_dispatcher.py, megatron-core 0.16.1) as the stack behaviour moe_dispatcher prices it.

The tiny MoE of test_moe_dispatch_and_expert_groups.py (hidden 32, 4 experts top-2; micro-batch 2 x 32 tokens,
bf16) on A100s, sp on. T = 64 local tokens, h = 32, E = 4, 2 bytes. The dispatch all-gathers each rank's hidden
state, routing probabilities (bf16) and routing map (bool) over tp x ep, priced as a stage over tp (a T-token
buffer: 64 x (32 x 2 + 4 x 2 + 4 x 1) = 4864 bytes) then over ep (T ep = 128 tokens: 9728); its backward
reduce-scatters the hidden state's and probabilities' gradient (64 x 36 x 2 = 4608, 9216). The combine
reduce-scatters the expert outputs (64 x 32 x 2 = 4096 over tp, 8192 over ep), its backward all-gathers them.
The all-to-all dispatcher instead gathers the T k = 128 routed copies over tp (8448 with their probabilities).
"""

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from conftest import tiny_moe_job
from trainsim.catalog.calibration import Calibration
from trainsim.cli.main import app
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.frontends.catalog.transformer import build_transformer
from trainsim.ir.graph import Comm, OpGraph
from trainsim.job import Job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.stack import make_stack

TP_STAGE = [("mlp.ag", "all-gather", "fwd", 4864.0), ("mlp.rs", "reduce-scatter", "fwd", 4096.0),
            ("mlp.ag", "all-gather", "bwd", 4096.0), ("mlp.rs", "reduce-scatter", "bwd", 4608.0)]
EP_STAGE = [("dispatch", "all-gather", "fwd", 9728.0), ("combine", "reduce-scatter", "fwd", 8192.0),
            ("combine", "all-gather", "bwd", 8192.0), ("dispatch", "reduce-scatter", "bwd", 9216.0)]


def _job(tp: int, ep: int, dispatcher: str, sp: bool = True) -> tuple[Job, OpGraph]:
    job = tiny_moe_job(tp, ep, sp)
    job = replace(job, stack=make_stack("megatron-core", {"moe_dispatcher": dispatcher}))
    return job, build_transformer(job.model, DeviceSlice.of(job.parallel, job.stack))  # type: ignore[arg-type]


def _dispatch(comms: tuple[Comm, ...], axis: str) -> list[tuple[str, str, str, float]]:
    return [(c.name, c.collective, c.phase, c.buffer_bytes) for c in comms
            if c.axis == axis and (axis == "ep" or c.name.startswith("mlp"))]


@pytest.mark.parametrize(("tp", "ep", "tp_stage", "ep_stage"),
                         [(2, 1, TP_STAGE, []), (2, 2, TP_STAGE, EP_STAGE), (1, 2, [], EP_STAGE)])
def test_the_hidden_state_is_gathered_over_tp_then_ep(tp: int, ep: int, tp_stage: list[object],
                                                     ep_stage: list[object]) -> None:
    _, graph = _job(tp, ep, "allgather", sp=tp > 1)
    block = graph.layers[1]
    assert _dispatch(block.comms, "tp") == tp_stage
    assert _dispatch(block.comms, "ep") == ep_stage


def test_the_alltoall_dispatcher_is_the_default_and_unchanged() -> None:
    _, graph = _job(2, 2, "alltoall")
    plain = tiny_moe_job(2, 2)
    default = build_transformer(plain.model, DeviceSlice.of(plain.parallel))  # type: ignore[arg-type]
    assert graph.layers[1].comms == default.layers[1].comms
    assert _dispatch(graph.layers[1].comms, "tp")[0] == ("mlp.ag", "all-gather", "fwd", 8448.0)
    assert make_stack(None).moe_dispatcher == "alltoall"


def test_the_dense_blocks_and_the_experts_compute_do_not_move() -> None:
    _, gather = _job(2, 2, "allgather")
    _, a2a = _job(2, 2, "alltoall")
    assert [layer.fwd for layer in gather.layers] == [layer.fwd for layer in a2a.layers]
    assert [layer.comms for i, layer in enumerate(gather.layers) if i != 1] == \
        [layer.comms for i, layer in enumerate(a2a.layers) if i != 1]


@pytest.mark.parametrize(("tp", "ep"), [(2, 1), (2, 2)])
def test_engines_agree_and_the_compiled_plan_carries_the_dispatcher(tp: int, ep: int) -> None:
    times = {}
    for dispatcher in ("alltoall", "allgather"):
        job, graph = _job(tp, ep, dispatcher)
        analytical = AnalyticalEstimator(Pricer(Calibration())).estimate(job, graph)
        sim = SimEstimator(Pricer(Calibration()), overlap=False, sharing=False).estimate(job, graph)
        assert sim.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=0.02)
        times[dispatcher] = (analytical.iteration_time_s, sim.iteration_time_s)
    assert times["allgather"][0] != times["alltoall"][0]
    assert times["allgather"][1] != times["alltoall"][1]


def test_refusals_name_the_field_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match="alltoall' or 'allgather"):
        make_stack(None, {"moe_dispatcher": "flex"})
    with pytest.raises(ConfigError, match="ep_comm_overlap needs moe_dispatcher alltoall"):
        make_stack(None, {"moe_dispatcher": "allgather", "ep_comm_overlap": True})
    with pytest.raises(ConfigError, match="needs sequence parallelism"):
        _job(2, 2, "allgather", sp=False)


def test_the_flag_reaches_the_price_and_a_bad_value_exits_2() -> None:
    runner = CliRunner()
    args = ["predict", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-80gb", "--num-gpus", "64", "--tp", "2",
            "--pp", "4", "--ep", "8", "--sp", "--recompute", "full", "--global-batch", "256", "--stack",
            "megatron-core", "--json"]
    figures = {}
    for dispatcher in ("alltoall", "allgather"):
        run = runner.invoke(app, [*args, "--moe-dispatcher", dispatcher])
        assert run.exit_code == 0, run.output
        figures[dispatcher] = run.output
    assert figures["alltoall"] != figures["allgather"]
    bad = runner.invoke(app, [*args, "--moe-dispatcher", "flex"])
    assert bad.exit_code == 2 and "moe_dispatcher" in bad.output and "Traceback" not in bad.output
