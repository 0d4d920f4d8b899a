"""Pass: order each stage's work by the pipeline schedule and connect the stages with send/recv tasks.

Model chunk c of pipeline rank r is virtual stage c * p + r (Megatron-LM's placement). A micro-batch's
activation crosses every virtual-stage boundary forward and its gradient crosses it backward; each crossing is
one transfer over the pipeline group's layout (Pricer.pipeline_hop_s per direction) on the feature
stream. The sender's next step waits for it (Megatron-LM's blocking p2p), and so does the receiving step.
"""

from typing import NamedTuple

from trainsim.compile.context import BuildContext
from trainsim.compile.in_flight import limit_in_flight
from trainsim.compile.schedules import Step, schedule_order
from trainsim.hardware.cluster import GroupLayout
from trainsim.strategy.lowered import LayerAssignment, LoweredPlan


class StepTids(NamedTuple):
    """Where a stage's schedule steps sit in the graph, per step of its program in order: each step's first chain
    task (the one that waits for a received tensor) and its last (the one whose output is sent)."""

    first: list[int]
    last: list[int]


def stage_programs(plan: LoweredPlan) -> list[list[Step]]:
    orders = schedule_order(str(plan.schedule), plan.num_stages, plan.num_chunks, plan.num_micro_batches)
    return [limit_in_flight(order, plan.max_in_flight) for order in orders]


def chunk_layers(plan: LoweredPlan) -> dict[tuple[int, int], list[LayerAssignment]]:
    """(stage, chunk) -> its layer instances in model order."""
    out: dict[tuple[int, int], list[LayerAssignment]] = {
        (s, c): [] for s in range(plan.num_stages) for c in range(plan.num_chunks)}
    for assignment in plan.layers:
        out[(assignment.stage, assignment.chunk)].append(assignment)
    return out


def boundary_bytes(plan: LoweredPlan) -> dict[int, float]:
    """Virtual stage -> bytes of the activation it hands to the next virtual stage (and of the gradient it
    gets back): the output of its last layer."""
    last: dict[int, float] = {}
    for assignment in plan.layers:  # model order, so the last write per virtual stage wins
        last[assignment.chunk * plan.num_stages + assignment.stage] = assignment.layer.output_bytes
    return last


# One tensor crossing a virtual-stage boundary: (what: "act" | "grad", micro-batch, boundary vs (between virtual
# stages vs and vs + 1), src, src_index, dst, dst_index, seconds): produced by step src_index of stage src, consumed
# by step dst_index of stage dst. NB: a plain tuple, built tens of thousands of times per compile.
_Transfer = tuple[str, int, int, int, int, int, int, float]
_SRC, _SRC_INDEX, _DST, _DST_INDEX = 3, 4, 5, 6
# a transfer task's fields: those that differ between transfers (a row's), and the rest
_ROW_FIELDS = ("name", "device", "duration_s", "deps", "sync_key", "resources", "micro_batch", "stage")
_ROW_CONSTANTS = {"stream": "feature", "kind": "comm", "alloc_bytes": 0.0, "free_bytes": 0.0, "phase": "comm",
                  "layer": "", "category": "pp_comm", "priority": 0, "link_shares": ()}


def _transfers(ctx: BuildContext, programs: list[list[Step]]) -> list[_Transfer]:
    plan = ctx.plan
    p, v = plan.num_stages, plan.num_chunks
    # NB: plain tuples (phase, micro-batch, chunk) look the Step keys up (a NamedTuple equals and hashes as its tuple)
    index: list[dict[tuple[str, int, int], int]] = [{step: i for i, step in enumerate(program)}
                                                   for program in programs]
    one_way = {vs: ctx.pipeline_hop_s(vs, size) for vs, size in boundary_bytes(plan).items()}
    sides = [(vs, one_way.get(vs, 0.0), vs % p, vs // p, index[vs % p], (vs + 1) % p, (vs + 1) // p,
              index[(vs + 1) % p]) for vs in range(p * v - 1)]  # (stage, chunk) on each side
    out: list[_Transfer] = []
    for mb in range(plan.num_micro_batches):
        for vs, seconds, lo, lo_chunk, lo_steps, hi, hi_chunk, hi_steps in sides:
            out.append(("act", mb, vs, lo, lo_steps[("F", mb, lo_chunk)], hi, hi_steps[("F", mb, hi_chunk)], seconds))
            out.append(("grad", mb, vs, hi, hi_steps[("B", mb, hi_chunk)], lo, lo_steps[("B", mb, lo_chunk)],
                        seconds))
    return out


def insert_transfers(ctx: BuildContext, programs: list[list[Step]],
                     steps: list[StepTids]) -> None:
    """Add the pipeline transfers and the dependencies of the receiving steps and of the senders' next steps.

    Two transfers in opposite directions between the same two stages where each stage sends after one step
    and receives for its very next step (1F1B's steady state: send the activation, receive the gradient) are
    one batched exchange, as Megatron-LM's send_forward_recv_backward / send_backward_recv_forward run them:
    one collective of both stages (one sync_key, a task on each one's feature stream), lasting the longer
    direction (links are full duplex); the earlier stage waits for the later one. Any other transfer is a task
    on the sender's feature stream that the receiving step depends on.

    NB: a receive is not put on the receiver's feature stream outside an exchange. With one feature stream per
    device it would serialize with the receiver's own send in the other direction, which Megatron-LM batches
    into one concurrent p2p call (interleaved 1F1B batches sends and receives of both directions per step
    pair); that artificial serialization cost 8% on GPT-3 175B with 16 stages.
    """
    plan = ctx.plan
    if plan.num_stages * plan.num_chunks == 1:
        return
    # A stack with pp_comm_overlap (interleaved schedules) sends without blocking and without batching the two
    # directions (Megatron-Core overlap_p2p_comm with batch_p2p_comm off: megatron_comm_overlap.py,
    # nemo-toolkit 2.0.0): the sender's next step does not wait for its send.
    overlap = plan.num_chunks > 1 and ctx.pricer.overlaps("pp_comm_overlap", ctx.job)
    transfers = _transfers(ctx, programs)
    # (sender, its step, receiver, its step) -> the transfers between them, in order: a transfer's possible partner is
    # found by one look-up
    between: dict[tuple[int, int, int, int], list[_Transfer]] = {}
    if not overlap:
        for t in transfers:
            between.setdefault((t[_SRC], t[_SRC_INDEX], t[_DST], t[_DST_INDEX]), []).append(t)
    merged: set[int] = set()
    layouts: dict[int, GroupLayout] = {}  # boundary -> its transfers' layout (BuildContext.hop_layout)

    def hop_layout(boundary: int) -> GroupLayout:
        if boundary not in layouts:
            layouts[boundary] = ctx.hop_layout(boundary)
        return layouts[boundary]

    columns = ctx.graph.writable_columns()
    deps = columns.deps
    # NB: the transfers' tasks as rows of _ROW_FIELDS (the others are _ROW_CONSTANTS), added to the columns at the
    # end; a send's name is made when first read (TaskColumns.names_later), from its affixes per direction and boundary
    rows: list[tuple[object, ...]] = []
    named: list[tuple[int, tuple[tuple[str, str], ...], int]] = []
    base = len(columns)
    firsts = [tids.first for tids in steps]
    lasts = [tids.last for tids in steps]
    # (direction, boundary) -> a send's links and name affixes
    one_way_sends: dict[tuple[str, int], tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {}
    lengths = list(map(len, programs))
    for t in transfers:
        if merged and id(t) in merged:
            continue
        what, micro_batch, boundary, src, src_index, dst, dst_index, seconds = t
        partner = None
        if src != dst and not overlap:
            for o in between.get((dst, dst_index - 1, src, src_index + 1), ()):  # sent after the step before
                if id(o) not in merged and o[_SRC] != o[_DST]:
                    partner = o
                    break
        if partner is not None:
            both = (src, dst) if src != dst else (src,)
            resources = ctx.link_resources(hop_layout(boundary), both)
            merged.update((id(t), id(partner)))
            key = f"pp.exchange.{what}{micro_batch}.vs{boundary}.{partner[0]}{partner[1]}"
            name = f"exchange {what} mb{micro_batch} vs{boundary} / {partner[0]} mb{partner[1]} vs{partner[2]}"
            for stage, produced, consumer in ((src, src_index, src_index + 1),
                                              (dst, partner[_SRC_INDEX], partner[_SRC_INDEX] + 1)):
                copy = base + len(rows)
                rows.append((name, stage, max(seconds, partner[7]), (lasts[stage][produced],), key, resources,
                             micro_batch, stage))
                receiver = firsts[stage][consumer]
                deps[receiver] = (*deps[receiver], copy)
            continue
        send = base + len(rows)  # (18,000 sends for GPT-3 175B)
        one_way = one_way_sends.get((what, boundary))  # (a direction and boundary gives the sender and receiver)
        if one_way is None:
            arrow = "->" if what == "act" else "<-"
            one_way = one_way_sends[(what, boundary)] = (ctx.link_resources(hop_layout(boundary), (src,), (dst,)),
                                                         ((f"send {what} mb", f" vs{boundary}{arrow}"),))
        resources, around = one_way
        named.append((send, around, micro_batch))  # "send act mb3 vs5->"
        rows.append(("", src, seconds, (lasts[src][src_index],), "", resources, micro_batch, src))
        receiver = firsts[dst][dst_index]
        deps[receiver] = (*deps[receiver], send)
        if src_index + 1 < lengths[src] and not overlap:  # blocking p2p: the sender's next step waits
            sender = firsts[src][src_index + 1]
            deps[sender] = (*deps[sender], send)
    columns.extend_rows(rows, _ROW_FIELDS, _ROW_CONSTANTS)
    columns.names_later(named)
