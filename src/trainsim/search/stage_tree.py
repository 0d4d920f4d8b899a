"""A stage plan whose stages differ in mesh or intra plan as a strategy tree, so the simulator re-checks it
(Alpa, Zheng et al. 2022, sec. 5: each stage on a submesh of its own; Proteus Sec. IV-B: a subtree mapped to its
own device mesh; compile/stage_meshes.py).

Stage i's units (embedding, blocks, head) map to {stage: i, tp, dp} of its intra plan; its devices are a
contiguous block of ranks after the stages before it. The job is made of stage 0's mesh at pp = the stages
(make_job(..., num_gpus=...): the stages' devices, not pp x stage 0's, are the cluster's), and the tree lowered
with the plan's device count. Every stage runs the same micro-batches of global_batch / B samples, split over its
replicas.
"""

from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision
from trainsim.strategy.stage_plan import StagePlan
from trainsim.strategy.tree import StrategyTree


def stage_plan_job(plan: StagePlan, model: TransformerSpec, cluster: ClusterSpec, *, global_batch: int,
                   seq_len: int, precision: Precision) -> Job:
    """The job a stage plan's tree is lowered for: stage 0's tp x dp at pp = the plan's stages, on the plan's
    devices. ConfigError where the stages' sequence parallelism differs or a stage's replicas do not split the
    micro-batch."""
    first = plan.stages[0].intra
    samples = global_batch // plan.num_micro_batches
    for i, stage in enumerate(plan.stages):
        if stage.intra.sp != first.sp:
            raise ConfigError("plan.sp", stage.intra.sp, f"stage {i} differs from stage 0's sequence parallelism "
                              f"({first.sp}); a plan's stages share it")
        if samples % stage.intra.dp:
            raise ConfigError("plan.dp", stage.intra.dp, f"stage {i}: the micro-batch of {samples} samples must "
                              f"split evenly over its dp={stage.intra.dp} replicas")
    par = ParallelSpec(tp=first.tp, dp=first.dp, pp=len(plan.stages), sp=first.sp,
                       micro_batch=samples // first.dp, global_batch=global_batch, seq_len=seq_len,
                       precision=precision, schedule="1f1b")
    return make_job(model, cluster.with_num_gpus(plan.devices), par, num_gpus=par.num_gpus)


def stage_plan_tree(plan: StagePlan, graph: OpGraph) -> StrategyTree:
    """Each stage's units mapped to its stage and intra plan (unit u is the tree's layer u: embedding, blocks,
    head in model order)."""
    tree = StrategyTree.from_graph(graph)
    if len(tree.layer_paths) != plan.stages[-1].end:
        raise ConfigError("plan.stages", plan.stages[-1].end, f"the plan covers {plan.stages[-1].end} units but the "
                          f"graph of {graph.model_name} has {len(tree.layer_paths)} layers")
    for i, stage in enumerate(plan.stages):
        mesh = {"stage": i, "tp": stage.intra.tp, "dp": stage.intra.dp}
        for unit in range(stage.first, stage.end):
            tree = tree.map(tree.layer_paths[unit], mesh)
    return tree


def stage_plan_lowered(plan: StagePlan, job: Job, graph: OpGraph) -> LoweredPlan:
    """The plan's tree lowered for `job` (stage_plan_job's) over the plan's devices."""
    return stage_plan_tree(plan, graph).lower(job.parallel, num_gpus=plan.devices)
