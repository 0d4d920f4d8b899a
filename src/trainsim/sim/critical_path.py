"""The critical path: the chain of tasks that determined when the iteration ended."""


def critical_path(end_s: list[float], cause: list[int], makespan_s: float | None = None) -> list[int]:
    """Walk back from the last-ending task (the lowest tid among ties) through each task's cause.

    cause[tid] is what held the task's start back: its last dependency to end, the task before it on its
    stream, or (for a collective rank) the partner rank that arrived last; -1 when it started at once.
    makespan_s: max(end_s), where the caller knows it (a scan of 150,000 ends saved).
    Returns tids in execution order, first task first.
    """
    if not end_s:
        return []
    last = end_s.index(max(end_s) if makespan_s is None else makespan_s)  # the lowest tid among ties
    path = [last]
    tid = cause[last]
    while tid >= 0:
        assert len(path) <= len(end_s), "cycle in the cause chain"
        path.append(tid)
        tid = cause[tid]
    path.reverse()
    return path
