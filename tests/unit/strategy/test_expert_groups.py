"""Megatron-Core's expert data-parallel group (strategy.expert_groups) over meshes that vary: the group is the
ranks holding rank 0's expert shard that ran other tokens, world / (etp x ep x pp) of them (megatron/core/
parallel_state.py, megatron-core 0.16.1)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.cost.pricing import axis_group
from trainsim.strategy.expert_groups import expert_data_ranks, expert_data_size, experts_own_group
from trainsim.strategy.parallel import ParallelSpec


@st.composite
def _meshes(draw: st.DrawFn) -> tuple[ParallelSpec, int]:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    expert_tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if tp % d == 0]))
    cp = draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([1, 2, 4, 8]))
    dp = max(1, ep // cp) * draw(st.sampled_from([1, 2, 3]))  # ep divides cp x dp (job.make_job's rule)
    sp = draw(st.booleans()) and tp > 1
    par = ParallelSpec(tp=tp, cp=cp, dp=dp, ep=ep, sp=sp, micro_batch=1, seq_len=64, global_batch=dp)
    return par, expert_tp


@settings(max_examples=200, deadline=None)
@given(_meshes())
def test_the_group_holds_one_expert_shard_and_has_megatron_core_s_size(mesh: tuple[ParallelSpec, int]) -> None:
    """Every rank of the group has rank 0's expert shard: tp index a multiple of d (the same 1/d of each expert;
    under sp any of the tp / d expert tp groups, which ran other sequence shares; without sp only tp index 0,
    whose tp / d groups ran the same tokens) and a position over cp and dp (cp fastest) a multiple of ep (the
    same ep share: Megatron-Core 0.16.1's expert mesh, whose ep groups stride over cp first). No rank of rank 0's
    ep group (cost.pricing.axis_group: ep ranks of stride tp) but rank 0 is in it. Its size is tp / d (sp) x cp
    x dp / ep, and it is the data-parallel group (tp index 0, every dp and cp rank) exactly where
    experts_own_group says it is not its own."""
    par, d = mesh
    ranks = expert_data_ranks(par, d)
    assert len(ranks) == len(set(ranks)) == expert_data_size(par, d)
    assert ranks[0] == 0
    for r in ranks:
        tp_index, position = r % par.tp, r // par.tp
        assert tp_index % d == 0 and (par.sp or tp_index == 0)
        assert position % par.ep == 0
    size, stride = axis_group("ep", par)
    assert set(range(0, size * stride, stride)) & set(ranks) == {0}
    assert len(ranks) * d * par.ep == (par.tp if par.sp else d) * par.cp * par.dp
    data_parallel = tuple(range(0, par.tp * par.cp * par.dp, par.tp))
    assert experts_own_group(par, d) == (ranks != data_parallel)
