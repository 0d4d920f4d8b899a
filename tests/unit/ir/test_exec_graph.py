"""ExecGraph's two ways of holding tasks (ir/exec_graph.py): Task objects, or columns (TaskColumns, what the compiler
writes), with Task objects made on demand; the simulator reads either the same way."""

import dataclasses

import pytest

from conftest import a100_cluster
from trainsim.catalog import load_model
from trainsim.catalog.calibration import Calibration
from trainsim.compile.build import compile_job
from trainsim.cost.pricing import Pricer
from trainsim.errors import ConfigError
from trainsim.estimate.simulation import SimEstimator, busy_by_device
from trainsim.ir.exec_graph import TASK_FIELDS, ExecGraph, SimDevice, Task, TaskColumns, TemplateRun
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.sim import SimOptions, simulate
from trainsim.strategy.lowered import default_plan
from trainsim.strategy.parallel import ParallelSpec

OPTIONS = SimOptions(overlap_slowdown=0.1, bandwidth_sharing=True)


def _devices(count: int) -> list[SimDevice]:
    return [SimDevice(index=d, stage=d, ranks=1, capacity_bytes=1e9, static_bytes=0.0) for d in range(count)]


def _compiled(schedule: str = "1f1b", vpp: int = 1) -> ExecGraph:
    job = make_job(load_model("gpt3-1.3b"), a100_cluster(16), ParallelSpec.parse(
        {"tp": 2, "pp": 4, "dp": 2, "vpp": vpp, "schedule": schedule, "micro_batch": 1, "global_batch": 16,
         "zero": 1, "recompute": "full"}))
    return compile_job(job, default_plan(graph_for(job), job.parallel), Pricer(Calibration()))


def _as_task_objects(graph: ExecGraph) -> ExecGraph:
    """The same graph built task by task, as hand-made graphs and the trace front-end build theirs."""
    out = ExecGraph(devices=graph.devices, tasks=[], resource_capacity=dict(graph.resource_capacity))
    for task in graph.tasks:
        out.add(**{name: getattr(task, name) for name in TASK_FIELDS})
    return out


def test_columns_and_task_objects_hold_the_same_tasks() -> None:
    tasks = [Task(0, "a", 0, "compute", "compute", 1.0, alloc_bytes=8.0, layer="L0", micro_batch=3, stage=0,
                  category="compute"),
             Task(1, "b", 1, "feature", "comm", 0.5, deps=(0,), sync_key="k", resources=("x", "y"),
                  link_shares=(2.0, 1.0), priority=1, phase="comm", stage=1)]
    columns = TaskColumns.of_tasks(tasks)
    assert len(columns) == 2 and columns.deps == [(), (0,)] and columns.link_shares == [(), (2.0, 1.0)]
    assert columns.to_tasks() == tasks
    held = ExecGraph(devices=_devices(2), columns=columns)
    assert held.held_as_columns and held.num_tasks == 2 and held.columns() is columns
    assert held.tasks == tasks and not held.held_as_columns  # made once; from now on the graph holds them
    assert held.tasks is held.tasks
    assert TaskColumns.of_tasks([]).to_tasks() == [] and len(TaskColumns()) == 0


def test_appended_rows_take_the_next_tids_and_the_stage_defaults_to_the_device() -> None:
    columns = TaskColumns()
    assert columns.append("a", 2, "compute", "compute", 1.0) == 0
    columns.extend_rows([("b", 1, "gradient", "comm", 2.0, (0,), "", (), 0.0, 0.0, "comm", "", -1, 1, "dp_comm", 0,
                          ())])
    assert columns.append("c", 0, "compute", "compute", 0.0, deps=(1,), stage=5) == 2
    tasks = columns.to_tasks()
    assert [(t.tid, t.name, t.stage) for t in tasks] == [(0, "a", 2), (1, "b", 1), (2, "c", 5)]
    assert tasks[1].category == "dp_comm" and tasks[2].deps == (1,)


def test_reading_columns_from_task_objects_copies_and_writing_takes_them_over() -> None:
    graph = ExecGraph(devices=_devices(1), tasks=[])
    first = graph.add(name="a", device=0, stream="compute", kind="compute", duration_s=1.0)
    copy = graph.columns()
    copy.duration_s[0] = 9.0
    assert first.duration_s == 1.0 and graph.tasks[0].duration_s == 1.0  # a copy: the graph is unchanged
    writable = graph.writable_columns()
    writable.duration_s[0] = 2.0
    assert graph.held_as_columns and graph.tasks[0].duration_s == 2.0
    graph.tasks[0].duration_s = 3.0  # Task objects made on demand are the graph's until columns are written again
    assert graph.columns().duration_s == [3.0]


def test_a_graph_holds_tasks_one_way_only() -> None:
    with pytest.raises(ValueError, match="not both"):
        ExecGraph(devices=[], tasks=[], columns=TaskColumns())
    assert ExecGraph(devices=[]).tasks == [] and ExecGraph(devices=[]).num_tasks == 0


def test_graphs_compare_by_their_tasks_whichever_way_they_hold_them() -> None:
    graph = _compiled()
    assert graph == _as_task_objects(_compiled())
    changed = _as_task_objects(_compiled())
    changed.tasks[-1].duration_s += 1.0
    assert graph != changed


@pytest.mark.parametrize(("schedule", "vpp"), [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)])
def test_the_compiler_writes_columns_that_simulate_as_its_task_objects_do(schedule: str, vpp: int) -> None:
    """compile_job's graph is held as columns; the same tasks as Task objects give the same outcome, field for
    field (times, memory and its timeline, exposed time, critical path, events), and the same busy time."""
    graph = _compiled(schedule, vpp)
    assert graph.held_as_columns
    objects = _as_task_objects(_compiled(schedule, vpp))
    assert not objects.held_as_columns
    columns_outcome, objects_outcome = simulate(graph, OPTIONS), simulate(objects, OPTIONS)
    assert graph.held_as_columns  # simulating read the columns, made no Task objects
    assert dataclasses.asdict(columns_outcome) == dataclasses.asdict(objects_outcome)
    assert busy_by_device(graph, columns_outcome) == busy_by_device(objects, objects_outcome)
    assert all(task.tid == tid for tid, task in enumerate(graph.tasks))


def test_the_sim_engine_returns_the_compiled_graph_for_the_trace_and_explain() -> None:
    job = make_job(load_model("gpt3-1.3b"), a100_cluster(8), ParallelSpec.parse(
        {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8}))
    run = SimEstimator().run(job, graph_for(job))
    assert run.busy_s == busy_by_device(run.graph, run.outcome)
    names = [task.name for task in run.graph.tasks]  # Task objects on demand, as report/trace.py reads them
    assert len(names) == len(run.outcome.end_s) and names[0].startswith("micro-batch overhead")


def test_names_given_around_a_micro_batch_are_made_when_read() -> None:
    columns = TaskColumns()
    columns.append("first", 0, "compute", "compute", 1.0)
    columns.name_later((("F", " L0 fwd"), ("tp comm mb", " L0")), ("", ""), 7)
    template = Task(0, "", 0, "compute", "compute", 1.0)
    for field in TASK_FIELDS[1:]:  # the other fields of the two tasks, as StageWriter.emit_block writes them
        getattr(columns, field).extend([getattr(template, field)] * 2)
    columns.extend_rows([("send", 0, "feature", "comm", 1.0, (2,), "", (), 0.0, 0.0, "comm", "", 7, 0, "pp_comm", 0,
                          ())])
    assert len(columns) == 4
    assert columns.name == ["first", "F7 L0 fwd", "tp comm mb7 L0", "send"]
    assert [task.name for task in columns.to_tasks()] == columns.name
    columns.device.append(0)
    with pytest.raises(ValueError, match="device"):
        columns.to_tasks()


def test_an_error_names_the_task_whose_name_is_made_later() -> None:
    """The simulator reads a task's name only to report it: a bad link share of a task named later still names it."""
    columns = TaskColumns()
    columns.name_later((("send mb", " vs0"),), ("",), 4)
    template = Task(0, "", 0, "feature", "comm", 1.0, resources=("nic",), link_shares=(-1.0,))
    for field in TASK_FIELDS[1:]:
        getattr(columns, field).append(getattr(template, field))
    graph = ExecGraph(devices=_devices(1), columns=columns)
    with pytest.raises(ConfigError, match=r"task 'send mb4 vs0'.link_shares"):
        simulate(graph, OPTIONS)


def test_a_template_run_must_be_the_last_tasks_written() -> None:
    """TaskColumns.note_template_run records tasks just written, after the runs before; a run elsewhere is refused."""
    columns = TaskColumns()
    for tid in range(4):
        columns.append(f"t{tid}", 0, "compute", "compute", 1.0, (tid - 1,) if tid else ())
    columns.note_template_run(TemplateRun(1, 0, (), columns.deps[2:4]))  # tids 1..3
    assert [(run.first, run.end) for run in columns.template_runs] == [(1, 4)]
    with pytest.raises(ValueError, match="must be the last tasks written"):
        columns.note_template_run(TemplateRun(0, 0, (), columns.deps[1:2]))  # tids 0..1: not the last
    columns.append("t4", 0, "compute", "compute", 1.0, (3,))
    with pytest.raises(ValueError, match="must be the last tasks written"):
        columns.note_template_run(TemplateRun(2, 0, (), columns.deps[3:5]))  # tids 2..4: overlaps the run before
    assert TaskColumns.of_tasks(columns.to_tasks()).template_runs == []  # Task objects read back: no runs


def test_phases_layers_and_micro_batches_written_later_read_as_written() -> None:
    """blocks_later holds a block's phases, layers and micro-batches until one of them is read; tasks appended or
    added as rows meanwhile keep theirs, and the Task objects read back are the ones written."""

    @dataclasses.dataclass(frozen=True)
    class Block:
        stream: tuple[str, ...]
        kind: tuple[str, ...]
        category: tuple[str, ...]
        phase: tuple[str, ...]
        layer: tuple[str, ...]

    fwd = Block(("compute",) * 2, ("compute",) * 2, ("compute",) * 2, ("fwd", "fwd"), ("l0", "l1"))
    bwd = Block(("compute",), ("compute",), ("compute",), ("bwd",), ("l1",))
    columns = TaskColumns()
    columns.append("first", 0, "compute", "compute", 1.0, phase="optimizer", layer="x", micro_batch=7)
    for _ in range(5):  # the blocks' other columns, as StageWriter.emit_blocks writes them
        columns.append("", 0, "compute", "compute", 1.0)
    columns._name[1:] = ["b"] * 5  # (named as the test likes)
    columns._phase[1:], columns._layer[1:], columns._micro_batch[1:] = [], [], []
    columns.blocks_later((fwd, bwd, fwd), [3, 3, 4], [2, 1, 2])  # type: ignore[arg-type]
    columns.extend_rows([("row", 1, "feature", "comm", 2.0, (0,), "", (), 0.0, 0.0, "comm", "", 5, 1, "pp_comm", 0,
                          ())])
    assert columns._blocks_later  # nothing written yet
    assert columns.phase == ["optimizer", "fwd", "fwd", "bwd", "fwd", "fwd", "comm"]
    assert not columns._blocks_later
    assert columns.layer == ["x", "l0", "l1", "l1", "l0", "l1", ""]
    assert columns.micro_batch == [7, 3, 3, 3, 4, 4, 5]
    tasks = columns.to_tasks()
    assert [(t.phase, t.layer, t.micro_batch) for t in tasks] == list(zip(
        columns.phase, columns.layer, columns.micro_batch, strict=True))
    again = TaskColumns()
    again.blocks_later((bwd,), [9], [1])  # type: ignore[arg-type]
    again.phase = ["recompute"]  # a column set whole: what was held is written first, then replaced
    assert again.phase == ["recompute"] and again.micro_batch == [9] and again.layer == ["l1"]


def test_rows_with_constant_fields_and_names_made_later() -> None:
    """extend_rows takes rows of some fields and one value each for the others (all fields once, else refused);
    names_later names added tasks when names are read."""
    fields = ("name", "device", "duration_s", "deps", "sync_key", "resources", "micro_batch", "stage")
    constants = {"stream": "feature", "kind": "comm", "alloc_bytes": 0.0, "free_bytes": 0.0, "phase": "comm",
                 "layer": "", "category": "pp_comm", "priority": 0, "link_shares": ()}
    columns = TaskColumns()
    columns.extend_rows([("", 0, 1.0, (), "", ("l",), 3, 0), ("kept", 1, 2.0, (0,), "k", (), 4, 1)], fields, constants)
    columns.names_later([(0, (("send act mb", " vs0->"),), 3)])
    assert columns.to_tasks() == [
        Task(0, "send act mb3 vs0->", 0, "feature", "comm", 1.0, (), "", ("l",), 0.0, 0.0, "comm", "", 3, 0, "pp_comm"),
        Task(1, "kept", 1, "feature", "comm", 2.0, (0,), "k", (), 0.0, 0.0, "comm", "", 4, 1, "pp_comm")]
    with pytest.raises(ValueError, match="must give each task field once"):
        columns.extend_rows([], fields, {**constants, "device": 0})
    with pytest.raises(ValueError, match="must give each task field once"):
        columns.extend_rows([], fields[1:], constants)
