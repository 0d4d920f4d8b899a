"""Capture the execution-trace fixtures: a 2-rank gloo DDP training of a tiny MLP on this machine.

Each rank trains for 3 iterations; the last one runs under torch.profiler with the ExecutionTraceObserver, so
every rank writes its execution trace (rank<R>.et.json) and the matching Kineto trace (rank<R>.kineto.json)
of that one iteration. Small gradient buckets give DDP several all-reduces that overlap the backward pass.

    nice -n 19 python scripts/capture_ddp_trace.py --gzip [--out tests/fixtures/exec_trace]

The files are compacted (no indentation) and gzip-compressed when --gzip is given (as the committed fixtures
are: about 10 KB each); the loaders read both. Timings depend on the machine's load: the committed fixtures
were taken on the 2-core development machine while other work ran (tests/unit/test_exec_trace.py).
"""

import argparse
import gzip
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.spawn import spawn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

WORLD_SIZE = 2
ITERATIONS = 3  # the last one is traced
HIDDEN = 256
BATCH = 64
LAYERS = 3
BUCKET_CAP_MB = 0.25  # 65,536 fp32 gradients per bucket: about one bucket per layer


def tiny_mlp() -> nn.Sequential:
    modules: list[nn.Module] = []
    for _ in range(LAYERS):
        modules += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    modules.append(nn.Linear(HIDDEN, 1))
    return nn.Sequential(*modules)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, port: int, workdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(0)
    model = DistributedDataParallel(tiny_mlp(), bucket_cap_mb=BUCKET_CAP_MB)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(BATCH, HIDDEN, generator=generator)
    targets = torch.randn(BATCH, 1, generator=generator)
    et_path = Path(workdir) / f"rank{rank}.et.json"
    kineto_path = Path(workdir) / f"rank{rank}.kineto.json"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=ITERATIONS - 1, warmup=0, active=1),
                 record_shapes=True, execution_trace_observer=observer,
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(kineto_path))) as prof:
        for _ in range(ITERATIONS):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            prof.step()
    observer.unregister_callback()
    dist.barrier()
    dist.destroy_process_group()


def _compact(source: Path, target: Path, use_gzip: bool) -> int:
    data = json.loads(source.read_text())
    text = json.dumps(data, separators=(",", ":"))
    if use_gzip:
        target = target.with_name(target.name + ".gz")
        with gzip.open(target, "wt", compresslevel=9) as handle:
            handle.write(text)
    else:
        target.write_text(text)
    return target.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/exec_trace"))
    parser.add_argument("--gzip", action="store_true", help="write .json.gz files")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="trainsim-et-")
    try:
        spawn(_worker, args=(_free_port(), workdir), nprocs=WORLD_SIZE, join=True)
        args.out.mkdir(parents=True, exist_ok=True)
        for rank in range(WORLD_SIZE):
            for kind in ("et", "kineto"):
                name = f"rank{rank}.{kind}.json"
                size = _compact(Path(workdir) / name, args.out / name, args.gzip)
                print(f"{args.out / name}{'.gz' if args.gzip else ''}: {size} bytes")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
