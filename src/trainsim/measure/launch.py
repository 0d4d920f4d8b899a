"""Launch a measured run on this machine: one worker process per rank, as torchrun would start them.

Each rank is `python -m trainsim.measure.worker --spec FILE` with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in its environment, in a session (process group) of its own. The launcher watches them: the first
rank that fails, or the timeout, kills every rank's process group and raises MeasureFailedError with one line
naming the rank and its error. Workers also exit when the launcher dies and give up on a collective after the
timeout, so nothing is left hanging.

No torch import at module level: `trainsim measure` checks a job before it starts any process.
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainsim.catalog.files import write_atomic
from trainsim.errors import MAX_NAME_CHARS, ConfigError, TrainsimError, check_name
from trainsim.ir.model_spec import DEEPSEEK_LAYOUT_FIELDS, TransformerSpec
from trainsim.job import Job
from trainsim.measure.results import job_to_dict, result_path
from trainsim.strategy.parallel import AttentionKernel, OptimizerImpl, Schedule

Device = Literal["cpu", "cuda"]
FAULT_ENV = "TRAINSIM_MEASURE_FAULT"  # test only: "crash:RANK" or "hang:RANK" (see worker.inject_fault)
PARENT_ENV = "TRAINSIM_MEASURE_PARENT"
# rank 0's inherited listening socket for the rendezvous store (the launcher binds it on loopback and holds it)
STORE_FD_ENV = "TRAINSIM_MEASURE_STORE_FD"
# bf16: a 16-bit model with fp32 main parameters in the optimizer (parallelize.MainParams), one rank only
MEASURED_PRECISIONS: dict[Device, tuple[str, ...]] = {"cpu": ("fp32", "amp-bf16", "bf16"),
                                                       "cuda": ("fp32", "tf32", "amp-bf16", "bf16")}
# the subset of strategy.parallel.SCHEDULES that torch.distributed.pipelining runs here (no zero-bubble split)
MEASURED_SCHEDULES: tuple[Schedule, ...] = ("gpipe", "1f1b", "interleaved-1f1b")
# flash2: torch SDPA (its fused kernel on a GPU); math: Megatron's unfused CoreAttention (measure/unfused_attention.py)
MEASURED_ATTENTION: tuple[AttentionKernel, ...] = ("flash2", "math")
POLL_S = 0.02
MAX_ITERATIONS = 1_000_000
MAX_TIMEOUT_S = 7 * 86400.0
MAX_THREADS = 4096


class MeasureFailedError(TrainsimError):
    """A rank crashed or hung: the run produced no result."""


class UnsupportedJobError(ConfigError):
    """A valid job that the measurement harness cannot run (yet)."""


def unsupported(message: str) -> UnsupportedJobError:
    error = UnsupportedJobError.across_fields("measure", message)
    assert isinstance(error, UnsupportedJobError)
    return error


@dataclass(frozen=True, slots=True)
class MeasureSpec:
    """Everything a worker needs, as JSON: the job, the loop settings and where the result goes."""

    run_id: str
    job: dict[str, Any]
    out_dir: str
    iterations: int = 20
    warmup: int = 5
    timeout_s: float = 600.0
    threads: int = 0  # intra-op threads per rank; 0 leaves torch's default
    device: Device = "cpu"
    profile: bool = False
    execution_trace: bool = False
    seed: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    # a strategy tree (its YAML text): the split executor (measure/split_model.py) runs its computation configs
    tree_yaml: str = ""
    dataflow: dict[str, list[str]] | None = None  # a CNN's layer inputs (measure/split_model_files.dataflow_beside)
    # "layer index:op name" -> the op's computation config [batch, seq, out, reduce] (compile.splits.plan_splits,
    # computed by the command, which sits above the compiler)
    op_configs: dict[str, list[int]] | None = None
    # a tree's per-op tp configs (tp > 1): model part -> op name -> its tp degree where it is not tp
    # (measure.tp_degrees, computed by the command); the job's Trainer runs them (measure/op_parallel.py)
    tp_degrees: dict[str, dict[str, int]] | None = None
    # and the split of those ops that is not Megatron's: part -> op name -> "reduce" or "seq" (measure/op_splits.py)
    tp_dims: dict[str, dict[str, str]] | None = None
    # a per-rank memory cap (bytes above the rank's resident memory before the model is built; 0: none): a rank
    # that goes past it stops the run, which records outcome "oom" instead of failing
    memory_cap_bytes: int = 0
    # time measure.phase's reference probe just before and just after every timed step, on every rank (outside
    # the step's timing and CPU figures): the run then reports its phase-normalised step time beside the raw one
    phase_probe: bool = False
    # the front-end whose model the ranks train: "catalog" (measure/model.py) or "torch" (the Hugging Face model the
    # torch front-end captures, measure/front_end_model.py), with the tp style of each module a tree splits
    # (measure.front_end_tp, computed by the command)
    frontend: str = "catalog"
    front_end_styles: dict[str, str] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "MeasureSpec":
        return cls(**json.loads(text))


def default_run_id(job: Job) -> str:
    """A readable file name from the model and the strategy: gpt-small_tp2-pp1-dp1-sp_mb4-gb4_1f1b_fp32."""
    p = job.parallel
    axes = f"tp{p.tp}-pp{p.pp}-dp{p.dp}" + (f"-vpp{p.vpp}" if p.vpp > 1 else "") + ("-sp" if p.sp else "")
    extras = [f"zero{p.zero}"] if p.zero else []
    extras += [f"rc-{p.recompute}"] if p.recompute != "none" else []
    parts = [job.model.name, axes, *extras, f"mb{p.micro_batch}-gb{p.global_batch}-s{p.seq_len}"]
    if p.pp > 1:
        parts.append(p.schedule)
    parts.append(p.precision)
    return re.sub(r"[^A-Za-z0-9._-]", "-", "_".join(parts))


def torch_default_optimizer(device: str) -> OptimizerImpl:
    """How torch.optim.AdamW runs when not told: foreach on CUDA tensors, one tensor at a time on a CPU."""
    return "foreach" if device == "cuda" else "loop"


def device_kind(job: Job) -> Device:
    """Where a job runs: the CPU for a CPU cluster (local-cpu), CUDA otherwise."""
    return "cpu" if job.cluster.device.name.startswith("cpu") else "cuda"


def pick_device(job: Job) -> Device:
    """The CPU for a CPU cluster (local-cpu); CUDA for a GPU cluster, which needs that many GPUs here (a GPU
    job is never quietly run on the CPU: its result would be compared with GPU predictions)."""
    if device_kind(job) == "cpu":
        return "cpu"
    try:
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        found = 0
    if found < job.num_gpus:
        raise unsupported(f"the job runs on {job.num_gpus} {job.cluster.device.name} GPU(s) but this machine has "
                          f"{found}; use --cluster local-cpu to measure it on the CPU, or torchrun across nodes "
                          "(docs/measure.md)")
    return "cuda"


def check_supported(job: Job, device: Device, tree: bool = False) -> None:
    """Refuse, with one line, every job the harness cannot run as stated (no silent substitutes)."""
    model = job.model
    p = job.parallel
    if tree:
        _check_split_run(job)
        return
    if not isinstance(model, TransformerSpec):
        raise unsupported(f"measure builds transformer models only, not a {model.kind} model")
    _check_built_structure(model)
    if model.is_moe and (p.tp > 1 or p.zero >= 2):
        raise unsupported(f"{model.name} is a mixture of experts (num_experts={model.num_experts}): measured with "
                          f"every expert on every rank, tp=1 and zero<2 only (got tp={p.tp}, zero={p.zero})")
    for axis, value in (("cp", p.cp), ("ep", p.ep)):
        if value > 1:
            raise unsupported(f"{axis}={value} is not measured (supported axes: dp, tp with sp, pp)")
    if p.precision not in MEASURED_PRECISIONS[device]:
        hint = " (16-bit mixed precision is measured as bf16 or amp-bf16)" if p.precision == "fp16" else ""
        raise unsupported(f"precision={p.precision} is not measured on {device}; choose one of "
                                  f"{', '.join(MEASURED_PRECISIONS[device])}{hint}")
    if p.precision == "bf16" and job.num_gpus > 1:
        raise unsupported(f"precision=bf16 is measured on one rank (got {job.num_gpus}); amp-bf16 runs on more")
    if p.pp > 1 and p.schedule not in MEASURED_SCHEDULES:
        raise unsupported(f"schedule={p.schedule} is not measured; choose one of {', '.join(MEASURED_SCHEDULES)}")
    if p.attention not in MEASURED_ATTENTION:
        raise unsupported(f"attention={p.attention} is not measured; choose one of {', '.join(MEASURED_ATTENTION)}")
    if p.tp > 1:
        _check_tp(model, job)
    if p.tp > 1 and p.dp > 1 and p.zero < 2:
        raise unsupported(f"tp={p.tp} with dp={p.dp} is measured with FSDP2 only (zero=2 or 3); "
                                  f"zero={p.zero} would need DDP over tensor-parallel DTensors")
    if p.pp > 1 and p.num_micro_batches < p.pp:
        raise unsupported(f"pp={p.pp} needs at least pp micro-batches; global_batch={p.global_batch} "
                                  f"/ (dp={p.dp} x micro_batch={p.micro_batch}) = {p.num_micro_batches}")


def _check_built_structure(model: TransformerSpec) -> None:
    """What measure's model builder (measure/model.py) does not build: a multi-head latent attention, experts of
    a width of their own, shared experts, leading dense blocks (DEEPSEEK_LAYOUT_FIELDS)."""
    for name in DEEPSEEK_LAYOUT_FIELDS:
        if getattr(model, name):
            raise unsupported(f"{name} of {model.name} is not built by measure (its attention has q, k and v "
                              "projections per head, its experts the model's ffn_hidden, every moe_every-th block)")


def _check_split_run(job: Job) -> None:
    """What a tree runs on: the split executor (measure/split_model.py) carves data-parallel ranks by the tree's
    computation configs; with tp > 1 the job's tp Trainer runs its per-op tp configs (measure/op_parallel.py) on
    tp ranks alone, without sp; fp32, no pipeline either way."""
    p = job.parallel
    others = ("dp", "pp", "cp", "ep") if p.tp > 1 else ("pp", "cp", "ep")
    for axis in others:
        if getattr(p, axis) > 1:
            why = (f"with a tree's tp configs (tp={p.tp}) the ranks are the tp group" if p.tp > 1
                   else "the tree's splits carve the data-parallel ranks")
            raise unsupported(f"{axis}={getattr(p, axis)} with --tree is not measured ({why})")
    if p.tp > 1 and p.sp:
        raise unsupported("sp with a tree's tp configs is not measured (a whole op reads the whole sequence)")
    if p.precision != "fp32" or p.zero:
        raise unsupported("--tree is measured in fp32 without ZeRO")
    if getattr(job.model, "is_moe", False) and (p.tp == 1 or getattr(job.model, "bias", False)):
        raise unsupported("--tree is measured for a mixture of experts with tp > 1 and experts without biases "
                          f"(got tp={p.tp}, bias={getattr(job.model, 'bias', False)})")
    if p.tp > 1:
        if not isinstance(job.model, TransformerSpec):
            raise unsupported(f"tp={p.tp} with --tree is measured for transformers, not {job.model.name}")
        _check_built_structure(job.model)
        _check_tp(job.model, job)


MEASURED_FRONTENDS = ("catalog", "torch")


def check_front_end(job: Job, tree: bool) -> None:
    """The torch front-end's model runs on the tp group alone (dp = pp = 1), fp32, without recompute, at tp 1 or
    with a tree's tp configs (measure/front_end_model.py)."""
    p = job.parallel
    if not isinstance(job.model, TransformerSpec) or job.model.is_moe:
        raise unsupported(f"--frontend torch is measured for dense transformers, not {job.model.name} (the "
                          "front-end traces an MoE with balanced routing, which a real router does not give)")
    for axis in ("dp", "pp", "cp", "ep"):
        if getattr(p, axis) > 1:
            raise unsupported(f"{axis}={getattr(p, axis)} with --frontend torch is not measured (the ranks are the "
                              "tp group)")
    if p.precision != "fp32" or p.zero or p.recompute != "none" or p.sp:
        raise unsupported("--frontend torch is measured in fp32 without ZeRO, recompute or sp")
    if p.tp > 1 and not tree:
        raise unsupported(f"tp={p.tp} with --frontend torch needs a strategy tree splitting the model's modules "
                          "(--tree); the captured graph is one device's whole model")
    if tree and p.tp == 1:
        raise unsupported("--tree with --frontend torch runs the tree's tp configs: give --tp > 1")
    _check_tp(job.model, job)


def _check_tp(model: TransformerSpec, job: Job) -> None:
    tp = job.parallel.tp
    for name, value in (("num_kv_heads", model.kv_heads), ("vocab", model.vocab), ("ffn_hidden", model.ffn_hidden)):
        if value % tp:
            raise unsupported(f"tp={tp} must divide {name}={value} of {model.name} to be measured")
    if job.parallel.sp and job.parallel.seq_len % tp:
        raise unsupported(f"sp needs tp={tp} to divide seq_len={job.parallel.seq_len}")


def make_spec(job: Job, out_dir: Path, *, run_id: str | None = None, iterations: int = 20, warmup: int = 5,
              timeout_s: float = 600.0, threads: int | None = None, device: Device | None = None,
              profile: bool = False, execution_trace: bool = False,
              labels: dict[str, str] | None = None, tree_yaml: str = "",
              dataflow: dict[str, list[str]] | None = None, memory_cap_bytes: int = 0,
              op_configs: dict[str, list[int]] | None = None, phase_probe: bool = False,
              tp_degrees: dict[str, dict[str, int]] | None = None,
              tp_dims: dict[str, dict[str, str]] | None = None, frontend: str = "catalog",
              front_end_styles: dict[str, str] | None = None) -> MeasureSpec:
    """Check the job and the loop settings; pick the device and the threads per rank (cores / ranks)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise TrainsimError("trainsim measure needs PyTorch: pip install -e '.[torch]' (torch==2.13.0)")
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise ConfigError("iterations", iterations, f"must be 1 to {MAX_ITERATIONS}")
    if not 0 <= warmup <= MAX_ITERATIONS:
        raise ConfigError("warmup", warmup, f"must be 0 to {MAX_ITERATIONS}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # NB: also refuses NaN
        raise ConfigError("timeout_s", timeout_s, f"must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}")
    if threads is not None and not 0 <= threads <= MAX_THREADS:
        raise ConfigError("threads", threads, f"must be 0 (torch's default) to {MAX_THREADS}")
    if run_id is not None and (problem := check_name("run_id", run_id)) is not None:
        raise problem
    chosen: Device = device or pick_device(job)
    if frontend == "torch":
        check_front_end(job, bool(tree_yaml))
    else:
        check_supported(job, chosen, tree=bool(tree_yaml))
    if memory_cap_bytes < 0:
        raise ConfigError("memory_cap_bytes", memory_cap_bytes, "must be >= 0 (0: no cap)")
    if threads is None:
        threads = 1 if chosen == "cpu" else 0
    return MeasureSpec(run_id or default_run_id(job)[:MAX_NAME_CHARS], job_to_dict(job), str(out_dir), iterations,
                       warmup, timeout_s, threads, chosen, profile, execution_trace, labels=labels or {},
                       tree_yaml=tree_yaml, dataflow=dataflow, memory_cap_bytes=memory_cap_bytes,
                       op_configs=op_configs, phase_probe=phase_probe, tp_degrees=tp_degrees,
                       tp_dims=tp_dims, frontend=frontend, front_end_styles=front_end_styles)


def free_port() -> int:
    """A loopback port free now, for a local rendezvous whose ranks bind it themselves (another process may take
    it before they do; launch's own store does not pick one: _store_socket)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _store_socket() -> socket.socket:
    """The rendezvous store's listening socket, on loopback (every rank is local), bound and listening before any
    rank starts: rank 0 inherits it (torch.distributed.TCPStore's master_listen_fd), so no other process can
    take the port between picking and binding it, and nothing off this host can connect."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    listener.set_inheritable(True)
    return listener


def log_path(out_dir: Path, run_id: str, rank: int) -> Path:
    return out_dir / "logs" / f"{run_id}.rank{rank}.log"


def error_path(out_dir: Path, run_id: str, rank: int) -> Path:
    """A worker's first exception, with the time it happened (the launcher blames the earliest)."""
    return out_dir / "logs" / f"{run_id}.rank{rank}.error.json"


@dataclass
class _Ranks:
    procs: list[subprocess.Popen[bytes]]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the rank's own session: it and its children
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def launch(spec: MeasureSpec, world_size: int, on_tick: Callable[[], None] | None = None) -> Path:
    """Run the spec on world_size local ranks; return the result file. Raise MeasureFailedError on a crash or
    a timeout (the message names the rank, its error and its log)."""
    out_dir = Path(spec.out_dir)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    spec_file = out_dir / "logs" / f"{spec.run_id}.spec.json"
    write_atomic(spec_file, spec.to_json())
    result_path(out_dir, spec.run_id).unlink(missing_ok=True)  # a failed rerun leaves no stale result behind
    for rank in range(world_size):
        error_path(out_dir, spec.run_id, rank).unlink(missing_ok=True)
    listener = _store_socket()
    port = int(listener.getsockname()[1])
    ranks = _Ranks([])
    try:
        for rank in range(world_size):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   PARENT_ENV: str(os.getpid())}
            if rank == 0:
                env[STORE_FD_ENV] = str(listener.fileno())
            if spec.device == "cpu" and "lo" in {name for _, name in socket.if_nameindex()}:
                env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's own pair sockets on loopback too
            if spec.threads:
                env["OMP_NUM_THREADS"] = str(spec.threads)
            with log_path(out_dir, spec.run_id, rank).open("wb") as log:
                ranks.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "trainsim.measure.worker", "--spec", str(spec_file)],
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, pass_fds=(listener.fileno(),) if rank == 0 else ()))
        listener.close()  # rank 0 holds its own copy
        _watch(ranks, spec, on_tick)
    finally:
        listener.close()
        ranks.kill()
    path = result_path(out_dir, spec.run_id)
    if not path.exists():
        raise MeasureFailedError(f"{spec.run_id}: every rank exited cleanly but rank 0 wrote no result {path}")
    return path


def _watch(ranks: _Ranks, spec: MeasureSpec, on_tick: Callable[[], None] | None) -> None:
    out_dir = Path(spec.out_dir)
    deadline = time.monotonic() + spec.timeout_s
    while True:
        codes = [proc.poll() for proc in ranks.procs]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            time.sleep(0.2)  # let the other ranks' error files land, then blame the earliest
            codes = [proc.poll() for proc in ranks.procs]
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
            ranks.kill()
            raise MeasureFailedError(_failure_message(spec, out_dir, failed, codes))
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            running = [rank for rank, code in enumerate(codes) if code is None]
            ranks.kill()
            raise MeasureFailedError(_timeout_message(spec, out_dir, running))
        if on_tick:
            on_tick()
        time.sleep(POLL_S)


# errors a rank reports because another rank died first (gloo/NCCL peers going away)
SECONDARY_ERRORS = ("connection reset by peer", "connection closed by peer", "broken pipe", "connection refused",
                    "socket timeout", "nccl communicator was aborted")


def _failure_message(spec: MeasureSpec, out_dir: Path, failed: list[int], codes: list[int | None]) -> str:
    """Blame the rank whose own error came first: an error file (written when the exception was caught) or
    the last log line of a rank that died without one (an abort in C++), peers' lost-connection errors last."""
    candidates: list[tuple[bool, float, int, str]] = []
    for rank in range(len(codes)):
        path = error_path(out_dir, spec.run_id, rank)
        try:
            record = json.loads(path.read_text())
            error, when = str(record["error"]), float(record["time"])
        except (OSError, ValueError, KeyError):
            if rank not in failed:
                continue
            error = _last_line(log_path(out_dir, spec.run_id, rank)) or f"exit code {codes[rank]}"
            when = float("inf")
        error = " ".join(error.split())[:400]
        candidates.append((any(s in error.lower() for s in SECONDARY_ERRORS), when, rank, error))
    _, _, rank, error = min(candidates)
    return (f"{spec.run_id}: rank {rank} failed: {error} (exit code {codes[rank]}; every rank killed; "
            f"log {log_path(out_dir, spec.run_id, rank)})")


def _timeout_message(spec: MeasureSpec, out_dir: Path, running: list[int]) -> str:
    shown = ", ".join(str(r) for r in running)
    last = "; ".join(f"rank {r}: {_last_line(log_path(out_dir, spec.run_id, r)) or '(nothing)'}" for r in running)
    return (f"{spec.run_id}: rank(s) {shown} did not finish within the timeout of {spec.timeout_s:g} s "
            f"(hung or too slow; every rank killed; last logged: {last}; logs in {out_dir / 'logs'})")


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
