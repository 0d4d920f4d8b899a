"""The compiler's template runs (TaskColumns.template_runs) as a shortcut for the readers of a compiled graph: where
the compiler wrote a stage's steps from step templates, a per-task list is made per block (one tuple per template,
extended once per step, in C) instead of per task (sim/arrays.py: streams, kinds, categories), the chain links are
found by identity instead of by comparing 148,561 dependency tuples (GPT-3 175B on 16 stages), and a run whose
blocks name no link to place is skipped (compile/place_links.py).

A run is relied on only as far as the columns still hold what it says: the fields read from its blocks are compared
with the columns' (whole slices, in C: `holding`), and a dependency tuple replaced since it was written (the
pipeline receives added to a step's first task) is found by identity; any other run, and everything between runs,
takes the per-task path. The lists made are the per-task path's, value for value (tests/unit/sim/test_arrays.py,
tests/unit/compile/test_place_links.py).
"""

from collections.abc import Callable, Sequence
from functools import reduce
from itertools import chain, compress
from operator import attrgetter, iadd, is_not, ne
from typing import NamedTuple, TypeVar

from trainsim.ir.exec_graph import ColumnBlock, TaskColumns, TemplateRun

_T = TypeVar("_T")



class Part(NamedTuple):
    """Tasks first .. end - 1: a template run's (run, and its blocks by id in order: keys, distinct), or none."""

    first: int
    end: int
    run: TemplateRun | None
    keys: list[int]  # id of each block, in order
    distinct: dict[int, ColumnBlock]  # each block once, by id


def parts(n: int, runs: Sequence[TemplateRun]) -> list[Part]:
    """Tasks 0 .. n - 1 in tid order as the runs' parts and the parts between them."""
    out: list[Part] = []
    at = 0
    for run in runs:
        if run.first > at:
            out.append(Part(at, run.first, None, [], {}))
        out.append(Part(run.first, run.end, run, run.keys, run.distinct))
        at = run.end
    if n > at:
        out.append(Part(at, n, None, [], {}))
    return out


def pieces_runs(pieces: Sequence[Part]) -> list[TemplateRun]:
    """The runs of these parts, in order."""
    return [piece.run for piece in pieces if piece.run is not None]


def ordered_runs(columns: TaskColumns, n: int) -> list[TemplateRun]:
    """The columns' template runs if they are in tid order, apart and within the n tasks; else none."""
    runs = columns.template_runs
    at = 0
    for run in runs:
        if run.first < at or run.end > n or run.end <= run.first:
            return []
        at = run.end
    return list(runs)


def holding(runs: Sequence[TemplateRun], device_of: Sequence[int], streams: Sequence[str], kinds: Sequence[str],
            categories: Sequence[str]) -> list[TemplateRun]:
    """The runs whose tasks' devices, streams, kinds and categories are still their blocks'."""
    return [run for run in runs if device_of[run.first:run.end].count(run.device) == run.end - run.first
            and _hold(run, ((streams, "stream"), (kinds, "kind"), (categories, "category")))]


def holding_resources(runs: Sequence[TemplateRun], resources: Sequence[tuple[str, ...]]) -> list[TemplateRun]:
    """The runs whose tasks' resources are still their blocks'."""
    return [run for run in runs if _hold(run, ((resources, "resources"),))]


def _hold(run: TemplateRun, fields: tuple[tuple[Sequence[object], str], ...]) -> bool:
    """Whether the columns hold the run's blocks' values of these fields (compared with what the run wrote, where it
    kept that, else with its blocks' values joined)."""
    first, end = run.first, run.end
    return all(column[first:end] == (run.written.get(name) or reduce(iadd, map(attrgetter(name), run.blocks), []))
               for column, name in fields)


def by_blocks(pieces: Sequence[Part], per_task: Callable[[int, int], Sequence[_T]],
              per_block: Callable[[ColumnBlock, TemplateRun], Sequence[_T]]) -> list[_T]:
    """A per-task list: per_task(first, end) for the tasks between runs, per_block(block, run) for each block of a
    run (made once per distinct block and run), in tid order."""
    out: list[_T] = []
    for piece in pieces:
        run = piece.run
        if run is None:
            out += per_task(piece.first, piece.end)
        else:
            made = {key: per_block(block, run) for key, block in piece.distinct.items()}
            reduce(iadd, map(made.__getitem__, piece.keys), out)
    return out


def first_appearances(pieces: Sequence[Part], column: Sequence[_T], read: Callable[[ColumnBlock], Sequence[_T]]
                      ) -> list[_T]:
    """The column's values in the order they first appear (a run's: its blocks', as the per-task column holds
    them)."""
    return list(dict.fromkeys(chain.from_iterable(
        column[piece.first:piece.end] if piece.run is None
        else chain.from_iterable(map(read, piece.distinct.values())) for piece in pieces)))


def not_chained(pieces: Sequence[Part], deps: Sequence[tuple[int, ...]]) -> list[int]:
    """The tasks, ascending, that do not wait for the task before them alone as far as the runs tell (a task whose
    dependency tuple was replaced since its run wrote it is among them, whatever it now holds)."""
    out: list[int] = []
    for piece in pieces:
        first, end, run = piece.first, piece.end, piece.run
        if run is None:
            out += compress(range(first, end), map(ne, deps[first:end], zip(range(first - 1, end - 1))))
        else:
            if deps[first] != (first - 1,):
                out.append(first)
            out += compress(range(first + 1, end), map(is_not, deps[first + 1:end], run.links))
    return out
