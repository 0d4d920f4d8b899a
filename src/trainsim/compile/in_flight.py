"""The limit on forward micro-batches in flight (Proteus Sec. IV-B, max_ongoing_micro_batch: "limits the
maximum number of forward micro-batches executed before each corresponding backward micro-batch at any time").

A stage's step order keeps its forwards in their order and its backward steps (B, W) in theirs; where a forward
would put more than `limit` forward steps ahead of their backward, the stage's next backward steps run first.
"""

from trainsim.compile.schedules import Step
from trainsim.errors import ConfigError


def limit_in_flight(order: list[Step], limit: int) -> list[Step]:
    """The order with at most `limit` forward steps whose backward (B) has not run; limit 0: unchanged."""
    if limit < 0:
        raise ConfigError("max_in_flight", limit, "must be >= 0 (0: what the schedule implies)")
    if limit == 0:
        return list(order)
    forwards = [s for s in order if s.phase == "F"]
    backwards = [s for s in order if s.phase != "F"]
    out: list[Step] = []
    in_flight = 0
    f = b = 0
    for step in order:  # the original order decides what comes next, the limit only holds forwards back
        if step.phase == "F":
            while in_flight >= limit and b < len(backwards):
                in_flight -= backwards[b].phase == "B"
                out.append(backwards[b])
                b += 1
            out.append(forwards[f])
            f += 1
            in_flight += 1
        elif b < len(backwards):
            in_flight -= backwards[b].phase == "B"
            out.append(backwards[b])
            b += 1
    out += backwards[b:]
    return out
