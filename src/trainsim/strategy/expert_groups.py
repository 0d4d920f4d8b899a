"""Megatron-Core's expert data-parallel group: the ranks that hold the same shard of an MoE layer's experts and
sum its gradient (and, from ZeRO-1 on, shard its optimizer states).

Megatron-Core lays the experts on a mesh of their own over the same ranks: expert tensor parallelism (etp, the
experts' tp degree d), expert parallelism (ep) and expert data parallelism, world / (etp x ep x pp) ranks
(initialize_model_parallel, megatron/core/parallel_state.py, megatron-core 0.16.1; 0.9.0 builds the same group
as the data-modulo-expert-parallel group, dp / ep ranks with etp = tp). The expert parameters (those experts.py
marks allreduce=False) go into buffers of their own, reduced over that group (expert_parallel_buffers,
megatron/core/distributed/distributed_data_parallel.py), and the distributed optimizer shards their states over
it (megatron/core/optimizer/__init__.py: the expert parameters' optimizer takes the expert data-parallel group).

trainsim's ranks: rank r has tp index r % tp, cp index r // tp % cp and data-parallel index r // (tp cp). An ep
group is ep consecutive positions q = r // tp over cp and dp together (cp fastest), each holding another ep
shard (cost.pricing axis_group): Megatron-Core 0.16.1's expert mesh (order tp-ep-dp-pp, the expert
RankGenerator built with cp = 1, so that its ep groups stride over the ranks' cp indices before their
data-parallel ones: ranks 0, tp, 2 tp ... at etp = tp; 0.9.0's data-modulo-expert order tp-cp-ep-dp-pp strode
tp x cp). Rank 0's expert data-parallel group is then every rank whose position q is a multiple of ep, at the tp
indices holding the same 1/d of each expert: those of the tp / d expert tp groups of its tp group under sp (each
ran other tokens, its own sequence share), tp index 0 alone without sp (the tp / d groups ran the same tokens
and hold the same gradient: it is summed once). NB: at d < tp Megatron-Core's ep groups stride d, within the
tp group; trainsim keeps its ep over cp and dp there."""

from trainsim.strategy.parallel import ParallelSpec


def expert_data_ranks(par: ParallelSpec, expert_tp: int) -> tuple[int, ...]:
    """Rank 0's expert data-parallel group (module doc) for experts split over expert_tp tp ranks."""
    replicas = par.tp // expert_tp if par.sp else 1  # expert tp groups of a tp group that ran other tokens
    return tuple(r for r in range(par.tp * par.cp * par.dp)
                 if r % par.tp % expert_tp == 0 and r % par.tp // expert_tp < replicas
                 and r // par.tp % par.ep == 0)


def expert_data_size(par: ParallelSpec, expert_tp: int) -> int:
    """How many ranks sum an expert shard's gradient: tp / d (under sp) x cp x dp / ep (expert_data_ranks)."""
    return (par.tp // expert_tp if par.sp else 1) * par.cp * par.dp // par.ep


def experts_own_group(par: ParallelSpec, expert_tp: int) -> bool:
    """Whether the expert data-parallel group differs from the data-parallel group (dp x cp ranks at tp index 0):
    ep > 1, or experts over fewer tp ranks than tp under sp."""
    return par.ep > 1 or (par.sp and expert_tp < par.tp)
