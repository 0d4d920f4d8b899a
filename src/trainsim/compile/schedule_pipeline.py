"""Pass: order each stage's work by the pipeline schedule and connect the stages with send/recv tasks.

Model chunk c of pipeline rank r is virtual stage c * p + r (Megatron-LM's placement). A micro-batch's
activation crosses every virtual-stage boundary forward and its gradient crosses it backward; each crossing is
one send-recv over the pipeline group's layout, seen by both simulated devices as a collective (one sync_key):
the sender's copy on its feature stream, the receiver's copy on its own. Both become ready when the producing
step ends, so both ranks see the transfer at the same moment; the sender's next step waits for its copy
(Megatron's blocking p2p), the receiver's consuming step waits for its copy.
"""

from dataclasses import dataclass

from trainsim.comm.collectives import collective_time_s
from trainsim.compile.context import BuildContext
from trainsim.compile.exec_graph import Task
from trainsim.compile.plan import ExecutionPlan, LayerAssignment
from trainsim.compile.schedules import Step, schedule_order


@dataclass(slots=True)
class StepRecord:
    """Where one schedule step's tasks sit in the graph: its first chain task, the first task of its first
    layer (the one that consumes a received tensor), and its last task (the one whose output is sent)."""

    first_tid: int
    consumer_tid: int
    last_tid: int


def stage_programs(plan: ExecutionPlan) -> list[list[Step]]:
    return schedule_order(str(plan.schedule), plan.num_stages, plan.num_chunks, plan.num_micro_batches)


def chunk_layers(plan: ExecutionPlan) -> dict[tuple[int, int], list[LayerAssignment]]:
    """(stage, chunk) -> its layer instances in model order."""
    out: dict[tuple[int, int], list[LayerAssignment]] = {
        (s, c): [] for s in range(plan.num_stages) for c in range(plan.num_chunks)}
    for assignment in plan.layers:
        out[(assignment.stage, assignment.chunk)].append(assignment)
    return out


def boundary_bytes(plan: ExecutionPlan) -> dict[int, float]:
    """Virtual stage -> bytes of the activation it hands to the next virtual stage (and of the gradient it
    gets back): the output of its last layer."""
    last: dict[int, float] = {}
    for assignment in plan.layers:  # model order, so the last write per virtual stage wins
        last[assignment.chunk * plan.num_stages + assignment.stage] = assignment.layer.output_bytes
    return last


def insert_transfers(ctx: BuildContext, records: dict[tuple[int, Step], StepRecord],
                     next_first: dict[tuple[int, Step], int]) -> None:
    """Add a send/recv pair per virtual-stage boundary, micro-batch and direction, and the dependencies of the
    receiving step on it and of the sender's next step on it."""
    plan = ctx.plan
    p, v = plan.num_stages, plan.num_chunks
    if p * v == 1:
        return
    sizes = boundary_bytes(plan)
    layout = ctx.layout("pp")
    one_way = {vs: collective_time_s("send-recv", size, layout, ctx.job.cluster, ctx.cal) for vs, size in sizes.items()}
    tasks = ctx.graph.tasks
    for mb in range(plan.num_micro_batches):
        for vs in range(p * v - 1):
            seconds = one_way.get(vs, 0.0)
            sender, receiver = vs % p, (vs + 1) % p
            fwd_from, fwd_to = Step("F", mb, vs // p), Step("F", mb, (vs + 1) // p)
            bwd_from, bwd_to = Step("B", mb, (vs + 1) // p), Step("B", mb, vs // p)
            for (src, src_step), (dst, dst_step), what in (
                    ((sender, fwd_from), (receiver, fwd_to), "act"),
                    ((receiver, bwd_from), (sender, bwd_to), "grad")):
                produced = records[(src, src_step)].last_tid
                key = f"pp.{what}.mb{mb}.vs{vs}"
                name = f"send {what} mb{mb} vs{vs}->{vs + 1}" if what == "act" else \
                    f"send {what} mb{mb} vs{vs + 1}->{vs}"
                resources = ctx.link_resources(layout, (src, dst))
                copies: list[Task] = []
                for device in (src, dst):
                    copies.append(ctx.add(name=name, device=device, stream="feature", kind="comm", duration_s=seconds,
                                          deps=(produced,), sync_key=key if src != dst else "", phase="comm",
                                          micro_batch=mb, stage=device, category="pp_comm", resources=resources))
                    if src == dst:  # a rank sending to itself (pp=1, vpp>1): one local copy
                        break
                consumer = tasks[records[(dst, dst_step)].consumer_tid]
                consumer.deps = (*consumer.deps, copies[-1].tid)
                follower = next_first.get((src, src_step))
                if follower is not None:
                    tasks[follower].deps = (*tasks[follower].deps, copies[0].tid)
