"""The grid engine's peak memory of interleaved plans of an uneven split (each stage holding its chunks' shares of
its activations) in numpy: to the bit the running sum of strategy.stages.interleaved_peak_chunks, and on the
searches' own uneven plans the same peaks as with that per-key loop."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.catalog import load_cluster, load_model
from trainsim.cost.memory import chunk_shares, saved_key
from trainsim.search import SearchSpace
from trainsim.search.grid import (
    _RECOMPUTE_NAMES,
    Floats,
    GridEngine,
    Ints,
    _ComboTable,
    _Fast,
    interleaved_peak_chunks_array,
)
from trainsim.search.planner import build_plans
from trainsim.search.space import plan_grid
from trainsim.strategy.stages import in_flight_micro_batches, interleaved_peak_chunks


def test_a_tiny_case_by_hand() -> None:
    """pp 2, vpp 2, 2 micro-batches, shares (0.25, 0.75). Rank 0: W = 2 (2 - 0 - 1) + (2 - 1) 2 = 4 = all 4
    forwards (chunks 0, 0, 1, 1): 0.25 + 0.25 + 0.75 + 0.75 = 2.0. Rank 1: W = 2, forwards 0, 0 (0.5), then
    forward 2 (chunk 1, 1.25), backward 0 (chunk 1, 0.5), forward 3 (chunk 1, 1.25): the peak 1.25."""
    shares = (0.25, 0.75)
    assert interleaved_peak_chunks_array(0, 2, 2, 2, shares) == 2.0
    assert interleaved_peak_chunks_array(1, 2, 2, 2, shares) == 1.25


@settings(max_examples=300, deadline=None)
@given(pp=st.integers(1, 12), vpp=st.integers(2, 6), m=st.integers(1, 40), data=st.data())
def test_equal_to_the_bit_to_the_per_step_loop(pp: int, vpp: int, m: int, data: st.DataObject) -> None:
    stage = data.draw(st.integers(0, pp - 1))
    weights = data.draw(st.lists(st.floats(0.01, 10.0), min_size=vpp, max_size=vpp))
    shares = [weight / sum(weights) for weight in weights]
    assert interleaved_peak_chunks_array(stage, pp, vpp, m, shares) == interleaved_peak_chunks(stage, pp, vpp, m,
                                                                                               shares)


def per_plan_loop(self: _Fast, plans: Ints, combos: _ComboTable, states: Floats,
                  held: tuple[Floats, Floats, Floats], reserved_bytes: float) -> Floats:
    """The grid's former _chunked_peaks: per plan and stage in Python, each stage's micro-batches in flight by
    strategy.stages.in_flight_micro_batches' loop (interleaved_peak_chunks), as cost.memory sums them."""
    batch = self.batch
    per_micro_batch, working, step = (values.tolist() for values in held)
    state_rows = states.tolist()
    peaks: list[float] = []
    for at, plan in enumerate(plans.tolist()):
        combo, mode, m = int(self.combo[plan]), int(self.recompute[plan]), int(self.m[plan])
        layout = combos.layouts[int(combos.kind[combo])]
        shape = batch.shared.combo_shapes[combo]
        saved = saved_key(_RECOMPUTE_NAMES[mode], batch.job0.stack)
        pp, vpp = int(self.pp[plan]), int(self.vpp[plan])
        flight = [in_flight_micro_batches("interleaved-1f1b", stage, pp, vpp, m,
                                          chunk_shares(batch._stage(shape, local), layout.chunk_blocks[stage], saved))
                  for stage, local in enumerate(layout.local)]
        peak = -np.inf
        for stage, local in enumerate(layout.local):
            activations = per_micro_batch[at][local] * flight[stage]
            if step[at][local] > activations + working[at][local]:
                total = state_rows[at][local] + 0.0 + 0.0 + step[at][local] + reserved_bytes
            else:
                total = state_rows[at][local] + activations + working[at][local] + 0.0 + reserved_bytes
            peak = max(peak, total)
        peaks.append(peak)
    return np.array(peaks)


def test_the_searchs_uneven_interleaved_peaks_as_the_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_moe_search.py's LLaMA-3.1-405B search (1,024 H100, 1,024 x 8,192): every 3rd of its interleaved
    plans, the peaks through the arrays and through the per-plan loop. (Its DeepSeek-V3 search has no interleaved
    plans: its uneven splits hold one chunk per stage, whose peaks are the grid's arrays already.)"""
    model = load_model("llama3.1-405b")
    cluster = load_cluster("dgx-h100-80gb").with_num_gpus(1024)
    space = SearchSpace(global_batch=1024, seq_len=8192)
    plans, columns = plan_grid(model, cluster, space)
    grid = build_plans(model, cluster, plans, space.stack)
    sample = [index for index, (job, _) in enumerate(grid.jobs) if job.parallel.vpp > 1][::3]
    jobs = [grid.jobs[index] for index in sample]
    taken = columns.take([grid.index[index] for index in sample])
    fast = GridEngine().price(jobs, taken).peak_memory_bytes
    calls: list[int] = []

    def counted(self: _Fast, plans: Ints, *rest: object) -> Floats:
        calls.append(len(plans))
        return per_plan_loop(self, plans, *rest)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(_Fast, "_chunked_peaks", counted)
    slow = GridEngine().price(jobs, taken).peak_memory_bytes
    assert sum(calls) > 100  # the uneven interleaved plans' path was taken
    assert fast.tolist() == slow.tolist()  # to the bit: the same sums in the same order
