"""StackSpec.ep_comm_overlap: the expert all-to-alls of one micro-batch hidden behind another's compute in the 1F1B
steady state (Megatron-Core's combined 1F1B schedule, megatron/core/pipeline_parallel/combined_1f1b.py, 0.16.1):
the share of paired passes by hand, a tiny MoE at ep 2 fully hidden where the other pass's compute is longer and
partly where it is not, the engines within 2%, and every figure unchanged where it does not apply."""

import pytest
import yaml

from conftest import TINY_MOE_MODEL_YAML, a100_cluster
from trainsim.catalog.calibration import Calibration
from trainsim.catalog.model_files import parse_model
from trainsim.cli.stack_options import STACK_FLAG_FIELDS
from trainsim.cost.pricing import Pricer
from trainsim.cost.roofline_arrays import op_times_s
from trainsim.cost.stack_effects import ep_overlap_share
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.ir.graph import Layer
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec, make_stack

ON, OFF = StackSpec(ep_comm_overlap=True), StackSpec()
SMALL = yaml.safe_load(TINY_MOE_MODEL_YAML)
WIDE = {**SMALL, "name": "wide-moe", "hidden": 4096, "ffn_hidden": 8192, "num_heads": 32, "max_seq_len": 4096}


def _job(model: dict[str, object], stack: StackSpec, num_gpus: int = 4, /, **strategy: object) -> Job:
    settings = {"micro_batch": 1, "seq_len": 32, "global_batch": 16, "ep": 2, **strategy}
    return make_job(parse_model(model), a100_cluster(num_gpus), ParallelSpec.parse(settings), stack)


def _share(stack: StackSpec, **strategy: object) -> float:
    return ep_overlap_share(stack, ParallelSpec.parse({"global_batch": 16, "micro_batch": 1, "dp": 4, **strategy}))


def test_paired_share_by_hand() -> None:
    # pp 1, 4 micro-batches a rank (16 / dp 4): the first forward and the last backward run alone
    assert _share(ON, ep=2) == 3 / 4
    # pp 2 vpp 2: 8 passes, rank 0's warm-up (2 - 1) * 2 + (2 - 1) * 2 + 1 = 5 runs alone: 3 of 8 paired
    assert _share(ON, ep=2, pp=2, vpp=2, schedule="interleaved-1f1b") == 3 / 8
    # pp 4 vpp 2: warm-up 6 + 4 + 1 = 11 of 8 passes: none paired
    assert _share(ON, ep=2, pp=4, vpp=2, schedule="interleaved-1f1b") == 0.0
    assert _share(ON, ep=2, pp=2) == 0.0  # Megatron-Core asserts a virtual pipeline size at pp > 1
    assert _share(ON, ep=2, recompute="full") == 0.0  # and refuses full recompute
    assert _share(ON, ep=1) == 0.0
    assert _share(OFF, ep=2) == 0.0
    assert ep_overlap_share(ON, ParallelSpec.parse({"ep": 2, "dp": 4}), overlaps=False) == 0.0


def _moe_layer(job: Job) -> Layer:
    return next(layer for layer in graph_for(job).layers if any(c.axis == "ep" for c in layer.comms))


def _ep_s(pricer: Pricer, layer: Layer, phase: str, job: Job) -> float:
    return sum(pricer.axis_collective_s(c.collective, c.buffer_bytes, "ep", job)
               for c in layer.comms if c.axis == "ep" and (c.phase == "fwd") == (phase == "fwd"))


@pytest.mark.parametrize("num_gpus, tp, hidden", [(4, 1, True), (16, 8, False)])
def test_all_to_alls_hide_behind_the_other_pass(num_gpus: int, tp: int, hidden: bool) -> None:
    """gamma 0 (the package's Calibration()): of the paired passes, what the other pass's compute of the layer
    cannot cover stays exposed; the unpaired ones all of it. On 4 GPUs (ep 2 within a server, 4 micro-batches a
    rank: 3 / 4 paired) the all-to-alls are shorter than either pass; at tp 8 on 16 (ep 2 across two servers,
    8 micro-batches: 7 / 8 paired) they are longer."""
    pricer = Pricer(Calibration())
    on, off = _job(WIDE, ON, num_gpus, tp=tp, seq_len=4096), _job(WIDE, OFF, num_gpus, tp=tp, seq_len=4096)
    share = 3 / 4 if hidden else 7 / 8
    assert ep_overlap_share(on.stack, on.parallel) == share
    layer = _moe_layer(on)
    plain, overlapped = pricer.layer_cost(layer, off), pricer.layer_cost(layer, on)
    assert plain.ep_exposed_fraction == (1.0, 1.0)
    ep_fwd, ep_bwd = _ep_s(pricer, layer, "fwd", on), _ep_s(pricer, layer, "bwd", on)
    forward, backward = pricer.ops_time_s(layer.fwd, on), pricer.ops_time_s(layer.bwd, on)
    assert ep_fwd > 0.0 and ep_bwd > 0.0
    if hidden:  # the all-to-alls are shorter than the pass beside them: all hidden when paired
        assert ep_fwd < backward and ep_bwd < forward
        assert overlapped.ep_exposed_fraction == (1 - share, 1 - share)
    else:  # over the network they outlast the compute: only the compute's length hides
        assert ep_fwd > backward and ep_bwd > forward
        expected = (1 - share + share * (ep_fwd - backward) / ep_fwd, 1 - share + share * (ep_bwd - forward) / ep_bwd)
        assert overlapped.ep_exposed_fraction == pytest.approx(expected, rel=1e-12)
    exposed = overlapped.ep_exposed_fraction[0] * ep_fwd + overlapped.ep_exposed_fraction[1] * ep_bwd
    assert overlapped.comm_s["ep"] == pytest.approx(exposed, rel=1e-12)
    assert plain.comm_s["ep"] == pytest.approx(ep_fwd + ep_bwd, rel=1e-12)
    for axis in plain.comm_s.keys() - {"ep"}:
        assert overlapped.comm_s[axis] == plain.comm_s[axis]


@pytest.mark.parametrize("num_gpus, tp", [(4, 1), (16, 8)])
def test_the_windows_are_the_layer_s_op_sums(num_gpus: int, tp: int) -> None:
    """The other pass's compute that hides the all-to-alls is the layer's forward or backward op sum: the same
    fractions, bit for bit, from layer_cost, from layer_comm_s left to sum the ops itself (the search's grid
    engine), and from a Pricer fed the ops' roofline times at once (Pricer.add_op_times)."""
    on = _job(WIDE, ON, num_gpus, tp=tp, seq_len=4096)
    layer, device = _moe_layer(on), on.cluster.device
    cost = Pricer(Calibration()).layer_cost(layer, on)
    assert cost.ep_exposed_fraction != (1.0, 1.0)
    assert Pricer(Calibration()).layer_comm_s(layer, on)[4] == cost.ep_exposed_fraction
    fed = Pricer(Calibration())
    fed.add_op_times(layer, device, tuple(op_times_s(layer.fwd + layer.bwd, device, fed.cal)))
    assert fed.layer_comm_s(layer, on)[4] == cost.ep_exposed_fraction
    assert fed.layer_cost(layer, on) == cost


@pytest.mark.parametrize("strategy", [{}, {"tp": 8, "num_gpus": 16},
                                      {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch": 32}])
def test_sim_agrees_with_analytical(strategy: dict[str, object]) -> None:
    """Runtime effects off: the engines within 2%, at ep 2 hidden (4 GPUs) and not (tp 8 over two servers), and
    on an interleaved pipeline; the overlap is faster than none."""
    pricer = Pricer(Calibration())
    settings = {"seq_len": 4096, **strategy}
    num_gpus = int(str(settings.pop("num_gpus", 4)))
    model = {**WIDE, "num_layers": 4}
    on, off = _job(model, ON, num_gpus, **settings), _job(model, OFF, num_gpus, **settings)
    assert ep_overlap_share(on.stack, on.parallel) > 0.0
    expected = AnalyticalEstimator(pricer).estimate(on, graph_for(on)).iteration_time_s
    got = SimEstimator(pricer, overlap=False, sharing=False).estimate(on, graph_for(on)).iteration_time_s
    assert got == pytest.approx(expected, rel=0.02)
    assert expected < AnalyticalEstimator(pricer).estimate(off, graph_for(off)).iteration_time_s


@pytest.mark.parametrize("strategy", [{"pp": 2}, {"ep": 1}, {"recompute": "full"}])
def test_unchanged_where_it_does_not_apply(strategy: dict[str, object]) -> None:
    """pp > 1 without interleaving, ep 1 and full recompute: bit-identical to the stack without it."""
    for engine in (AnalyticalEstimator, SimEstimator):
        on, off = _job(SMALL, ON, **strategy), _job(SMALL, OFF, **strategy)
        got = engine(Pricer(Calibration())).estimate(on, graph_for(on))
        expected = engine(Pricer(Calibration())).estimate(off, graph_for(off))
        assert got.iteration_time_s == expected.iteration_time_s
        assert got.breakdown == expected.breakdown


def test_set_one_by_one_and_as_a_flag() -> None:
    assert "ep_comm_overlap" in STACK_FLAG_FIELDS
    assert make_stack("megatron-core", {"ep_comm_overlap": True}).ep_comm_overlap
    assert not make_stack({"preset": "megatron-core", "ep_comm_overlap": False}).ep_comm_overlap
