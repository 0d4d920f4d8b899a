"""Search: the enumerated space by hand, the counts per reason, the ranking, and the CLI's JSON and errors."""

import gc
import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from trainsim.catalog.model_files import parse_model
from trainsim.cli.main import app
from trainsim.divisors import divisors
from trainsim.errors import ConfigError, TrainsimError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.search import OUT_OF_MEMORY, Planner, SearchSpace, enumerate_plans
from trainsim.search.planner import build_plans, refusal_reason
from trainsim.search.space import ep_candidates, micro_batch_candidates, vpp_candidates
from trainsim.strategy.parallel import ParallelSpec


def tiny_model(num_layers: int = 4, num_heads: int = 4) -> ModelSpec:
    return parse_model({"name": f"tiny-{num_layers}x{num_heads}", "num_layers": num_layers,
                        "hidden": 16 * num_heads, "ffn_hidden": 64 * num_heads, "num_heads": num_heads,
                        "vocab": 1000})


def test_divisors() -> None:
    assert divisors(1) == [1]
    assert divisors(16) == [1, 2, 4, 8, 16]
    assert divisors(80) == [1, 2, 4, 5, 8, 10, 16, 20, 40, 80]


def test_vpp_and_micro_batch_candidates() -> None:
    model = parse_model({"name": "m80", "num_layers": 80, "hidden": 64, "ffn_hidden": 256, "num_heads": 4,
                         "vocab": 100})
    assert vpp_candidates(model, 1, 8) == [1]
    assert vpp_candidates(model, 2, 8) == [1, 2, 4, 5, 8]
    assert vpp_candidates(model, 16, 8) == [1, 5]
    assert micro_batch_candidates(1024, 1024, 8, 16) == [1, 2, 4, 8]  # dp=128: 1024/128 = 8
    assert micro_batch_candidates(64, 8, 1, 4) == [1, 2, 4]  # capped
    assert micro_batch_candidates(4, 8, 1, 16) == [1]  # dp=8 does not divide 4: tried once, refused
    assert micro_batch_candidates(16, 8, 3, 16) == [1]  # no whole dp


def test_enumeration_count_by_hand(cluster8: ClusterSpec) -> None:
    """4 layers, 4 heads, 8 GPUs, global batch 16: tp in 1 2 4, pp in 1 2 4, vpp=2 only for pp=2, 12 plans per
    (tp, pp, vpp, mb, sp) from 3 recompute modes x 4 ZeRO stages."""
    # (tp, pp): micro-batches (divisors of 16/dp) x vpp choices x sp choices
    by_hand = {
        (1, 1): 2 * 1 * 1, (1, 2): 3 * 2 * 1, (1, 4): 4 * 1 * 1,
        (2, 1): 3 * 1 * 2, (2, 2): 4 * 2 * 2, (2, 4): 5 * 1 * 2,
        (4, 1): 4 * 1 * 2, (4, 2): 5 * 2 * 2, (4, 4): 1 * 1 * 2,  # tp*pp=16 > 8 GPUs: mb=1 only, refused
    }
    plans = list(enumerate_plans(tiny_model(), cluster8, SearchSpace(global_batch=16, seq_len=128)))
    assert len(plans) == 12 * sum(by_hand.values()) == 888
    assert Counter((p.tp, p.pp) for p in plans) == {key: 12 * n for key, n in by_hand.items()}
    assert len(set(plans)) == len(plans)
    assert all(p.cp == 1 and p.ep == 1 and p.dp == 0 for p in plans)
    assert all((p.schedule == "interleaved-1f1b") == (p.vpp > 1) for p in plans)
    assert not any(p.sp and p.tp == 1 for p in plans)


def test_search_counts_and_ranking(cluster8: ClusterSpec) -> None:
    report = Planner().search(tiny_model(), cluster8, SearchSpace(global_batch=16, seq_len=128), top_k=1000)
    # Refused by hand: tp=4 pp=4 needs 16 GPUs (24 plans); interleaved-1f1b with one micro-batch per stage
    # pass fails "micro-batches % pp": (tp=1, pp=2, mb=4), (tp=2, pp=2, mb=8) x sp, (tp=4, pp=2, mb=16) x sp.
    assert report.infeasible == {"global_batch": 12 * 5, "tp*pp*cp": 24}
    assert report.tried == 888
    assert report.feasible == 888 - 84 == len(report.plans)
    assert [plan.rank for plan in report.plans] == list(range(1, report.feasible + 1))
    keys = [(plan.result.tokens_per_s, -plan.result.peak_memory_bytes) for plan in report.plans]
    assert keys == sorted(keys, reverse=True)
    for plan in report.plans:
        assert not plan.result.oom
        assert plan.parallel.dp * plan.parallel.tp * plan.parallel.pp == 8
        assert plan.parallel.global_batch == 16


def test_planner_matches_brute_force_with_oom(cluster8: ClusterSpec) -> None:
    """Differential: a device small enough that some plans do not fit; every plan classified directly."""
    device = cluster8.device.model_copy(update={"hbm_bytes": 2.0 * 2**30 + 28e6})
    cluster = cluster8.model_copy(update={"device": device})
    model, space = tiny_model(8, 8), SearchSpace(global_batch=32, seq_len=512, max_micro_batch=8)
    estimator = AnalyticalEstimator()
    expected: Counter[str] = Counter()
    feasible = []
    for par in enumerate_plans(model, cluster, space):
        try:
            result = estimator.estimate(make_job(model, cluster, par), graph_for(make_job(model, cluster, par)))
        except TrainsimError as exc:
            expected[refusal_reason(exc)] += 1
            continue
        if result.oom:
            expected[OUT_OF_MEMORY] += 1
        else:
            feasible.append(result)
    assert expected[OUT_OF_MEMORY] > 0 and feasible
    report = Planner().search(model, cluster, space, top_k=3)
    assert report.infeasible == dict(expected)
    assert report.feasible == len(feasible)
    assert len(report.plans) == 3
    best = max(r.tokens_per_s for r in feasible)
    assert report.plans[0].result.tokens_per_s == best


def test_impossible_global_batch_reports_reasons(cluster8: ClusterSpec) -> None:
    """3 layers, 3 heads: tp=1 only; pp=1 gives dp=8 > global batch 2, pp=2 (the loss counted in the split: 2
    layers a rank, vpp 1 or 2) dp=4 > 2, pp=3 does not divide 8 GPUs."""
    report = Planner().search(tiny_model(3, 3), cluster8, SearchSpace(global_batch=2))
    assert report.plans == []
    assert report.feasible == 0
    assert report.tried == 48
    assert report.infeasible == {"global_batch": 36, "tp*pp*cp": 12}


def test_progress_callback(cluster8: ClusterSpec) -> None:
    calls: list[tuple[int, int]] = []
    report = Planner().search(tiny_model(), cluster8, SearchSpace(global_batch=16, seq_len=128),
                              progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, report.tried)
    assert calls[-1] == (report.tried, report.tried)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_build_plans_keeps_the_accepted_plans_in_order(cluster8: ClusterSpec) -> None:
    """build_plans (the grid Planner.search, the search benchmark and the grid engine's tests price): each plan
    make_job accepts, in order, with its graph; each one it refuses under its index, with the same error."""
    model, space = tiny_model(), SearchSpace(global_batch=16, seq_len=128)
    plans = list(enumerate_plans(model, cluster8, space))
    calls: list[tuple[int, int]] = []
    grid = build_plans(model, cluster8, plans, space.stack, progress=lambda done, total: calls.append((done, total)))
    assert len(grid.refused) == 84 and len(grid.jobs) == len(grid.index) == len(plans) - 84
    assert sorted([*grid.index, *grid.refused]) == list(range(len(plans)))
    assert grid.index == sorted(grid.index)
    for (job, graph), at in zip(grid.jobs, grid.index, strict=True):
        assert job == make_job(model, cluster8, plans[at], space.stack)
        assert graph == graph_for(job)
    for at, exc in grid.refused.items():
        with pytest.raises(type(exc)) as raised:
            make_job(model, cluster8, plans[at], space.stack)
        assert str(raised.value) == str(exc)
        # kept without its traceback: its frames would hold `refused` and the grid in a reference cycle
        assert exc.__traceback__ is None
    assert calls[0] == (0, len(plans)) and [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_a_search_leaves_no_cyclic_garbage(cluster8: ClusterSpec) -> None:
    """The refused plans' errors, kept with their tracebacks, made the refusals, the jobs and the graphs of a
    search a reference cycle the collector's full pass had to find (~55,000 objects for LLaMA-3.1-70B on 1,024
    GPUs); without them a search frees its grid as it ends."""
    model, space = tiny_model(), SearchSpace(global_batch=16, seq_len=128)
    Planner().search(model, cluster8, space, top_k=1)  # NB: the first search also builds what later ones reuse
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        report = Planner().search(model, cluster8, space, top_k=1)
        unreachable = gc.collect()
    finally:
        if collecting:
            gc.enable()
    assert report.infeasible and unreachable < 50


def test_bad_space_and_top_k(cluster8: ClusterSpec) -> None:
    with pytest.raises(ConfigError, match="global_batch"):
        SearchSpace(global_batch=0)
    with pytest.raises(ConfigError, match="zero"):
        SearchSpace(global_batch=8, zero_stages=(4,))
    with pytest.raises(ConfigError, match="top_k"):
        Planner().search(tiny_model(), cluster8, SearchSpace(global_batch=8), top_k=0)


CLI_ARGS = ["search", "--model", "gpt3-125m", "--cluster", "dgx-a100-80gb", "--num-gpus", "8",
            "--global-batch", "16", "--seq-len", "512"]


def test_cli_json_shape() -> None:
    result = CliRunner().invoke(app, [*CLI_ARGS, "--top-k", "3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"schema", "title", "model", "cluster", "num_gpus", "objective", "memory_capacity_gib",
                         "plans", "tried", "feasible", "infeasible"}
    assert data["schema"] == {"name": "trainsim.search", "version": 1}
    assert data["tried"] == data["feasible"] + sum(data["infeasible"].values())
    assert [plan["rank"] for plan in data["plans"]] == [1, 2, 3]
    for plan in data["plans"]:
        assert set(plan["strategy"]) == set(ParallelSpec.model_fields)
        assert {"iteration_time_s", "tokens_per_s", "mfu", "peak_memory_gib"} <= set(plan)
        assert plan["strategy"]["cp"] == 1 and plan["strategy"]["ep"] == 1
    rates = [plan["tokens_per_s"] for plan in data["plans"]]
    assert rates == sorted(rates, reverse=True)


def test_cli_table() -> None:
    result = CliRunner().invoke(app, [*CLI_ARGS, "--top-k", "2"])
    assert result.exit_code == 0, result.output
    assert "recompute" in result.stdout and "peak GiB" in result.stdout
    assert "feasible" in result.stdout


@pytest.mark.parametrize("extra", [["--top-k", "0"], ["--precision", "fp7"], ["--max-micro-batch", "-1"],
                                   ["--model", "no-such-model"], ["--num-gpus", "12"], ["--attention", "flash4"],
                                   ["--optimizer-impl", "sgd"]])
def test_cli_bad_input_exits_2_with_one_line(extra: list[str]) -> None:
    result = CliRunner().invoke(app, [*CLI_ARGS, *extra])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_plans_carry_the_stack_inputs() -> None:
    args = [*CLI_ARGS, "--top-k", "2", "--json", "--attention", "math", "--optimizer-impl", "foreach"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert plans and all(p["strategy"]["attention"] == "math" for p in plans)
    assert all(p["strategy"]["optimizer_impl"] == "foreach" for p in plans)


def test_cli_global_batch_is_required() -> None:
    result = CliRunner().invoke(app, ["search", "--model", "gpt3-125m"])
    assert result.exit_code == 2
    assert "global_batch" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("collecting", [True, False])
def test_search_leaves_the_collector_as_it_was(cluster8: ClusterSpec, collecting: bool) -> None:
    """A search pauses the cyclic garbage collector while it works (trainsim.collector, speed only): the caller's
    setting comes back, after a refused search too, and the ranking is the one made with the collector on."""
    space = SearchSpace(global_batch=16, seq_len=128)
    seen: list[bool] = []
    reference = Planner().search(tiny_model(), cluster8, space, top_k=5)
    if not collecting:
        gc.disable()
    try:
        report = Planner().search(tiny_model(), cluster8, space, top_k=5,
                                  progress=lambda done, total: seen.append(gc.isenabled()))
        assert gc.isenabled() is collecting
        with pytest.raises(ConfigError, match="top_k"):
            Planner().search(tiny_model(), cluster8, space, top_k=0)
        assert gc.isenabled() is collecting
    finally:
        gc.enable()
    assert seen and not any(seen)  # paused while it enumerates and prices
    assert [(plan.parallel, plan.result.iteration_time_s, plan.result.peak_memory_bytes) for plan in report.plans] \
        == [(plan.parallel, plan.result.iteration_time_s, plan.result.peak_memory_bytes) for plan in reference.plans]


def tiny_moe(num_experts: int) -> ModelSpec:
    return TransformerSpec(name=f"tiny-moe-{num_experts}", arch="gpt", num_layers=2, hidden=64, ffn_hidden=128,
                           num_heads=4, vocab=1000, max_seq_len=2048, num_experts=num_experts, top_k=2)


def test_expert_parallel_degrees_by_hand(cluster8: ClusterSpec) -> None:
    """12 experts on 8 GPUs: ep the powers of two dividing both 12 and dp = 8 / (tp x pp), so 3, 6, 8 and 12 are
    never tried; a dense model keeps ep 1 (space.ep_candidates)."""
    assert ep_candidates(tiny_moe(12), 8, 1) == [1, 2, 4]  # gcd(12, 8) = 4
    assert ep_candidates(tiny_moe(12), 24, 1) == [1, 2, 4]  # gcd(12, 24) = 12: 3, 6, 12 left out
    assert ep_candidates(tiny_moe(16), 64, 2) == [1, 2, 4, 8, 16]
    assert ep_candidates(tiny_moe(16), 8, 3) == [1]  # no whole dp
    assert ep_candidates(tiny_model(), 64, 1) == [1]
    space = SearchSpace(global_batch=16, seq_len=128, recomputes=("none",), zero_stages=(1,))
    plans = list(enumerate_plans(tiny_moe(12), cluster8, space))
    by_hand = {(1, 1): {1, 2, 4}, (1, 2): {1, 2, 4}, (2, 1): {1, 2, 4}, (2, 2): {1, 2}, (4, 1): {1, 2},
               (4, 2): {1}}
    found: dict[tuple[int, int], set[int]] = {}
    for plan in plans:
        found.setdefault((plan.tp, plan.pp), set()).add(plan.ep)
    assert found == by_hand
    # each (tp, pp, ep) carries the same micro-batch, vpp and sp choices as ep 1 does
    at_ep1 = Counter((p.tp, p.pp) for p in plans if p.ep == 1)
    assert Counter((p.tp, p.pp, p.ep) for p in plans) == {(tp, pp, ep): at_ep1[tp, pp]
                                                           for (tp, pp), eps in by_hand.items() for ep in eps}
    report = Planner().search(tiny_moe(12), cluster8, space)
    assert "ep" not in report.infeasible  # make_job accepts every ep enumerated


def test_a_dense_plan_set_keeps_ep_1(cluster8: ClusterSpec) -> None:
    """A dense model's plans are those of the enumeration without an ep axis: ep 1, the same count."""
    plans = list(enumerate_plans(tiny_model(), cluster8, SearchSpace(global_batch=16, seq_len=128)))
    assert len(plans) == 888 and all(plan.ep == 1 for plan in plans)


def test_the_best_moe_plan_is_the_plain_engines(cluster8: ClusterSpec) -> None:
    """Differential: over every plan of a tiny MoE's grid (ep 1, 2, 4), the search's best plan and its figures
    are those of the plain engine pricing each plan alone (ranked by tokens/s, then lower peak memory, then the
    enumeration's order)."""
    model = tiny_moe(4)
    space = SearchSpace(global_batch=16, seq_len=128, recomputes=("none", "full"), zero_stages=(0, 3))
    plans = list(enumerate_plans(model, cluster8, space))
    assert {plan.ep for plan in plans} == {1, 2, 4}
    ranked = []
    for index, par in enumerate(plans):
        try:
            job = make_job(model, cluster8, par)
            result = AnalyticalEstimator().estimate(job, graph_for(job))
        except TrainsimError:
            continue
        if not result.oom:
            ranked.append(((result.tokens_per_s, -result.peak_memory_bytes, -index), job.parallel, result))
    ranked.sort(key=lambda entry: entry[0], reverse=True)
    report = Planner().search(model, cluster8, space, top_k=5)
    assert report.feasible == len(ranked)
    assert [plan.parallel for plan in report.plans] == [par for _, par, _ in ranked[:5]]
    assert report.plans[0].result.tokens_per_s == ranked[0][2].tokens_per_s
    assert report.plans[0].result.peak_memory_bytes == ranked[0][2].peak_memory_bytes
