"""A small GPT trained with DDP on 2 gloo ranks of this machine: measured iteration times and one traced iteration
per rank (PyTorch execution trace + Kineto), the input of the NLP check of Lin et al.'s predictive trace
simulation (Sec. IV-B2, which reports 3.00% geomean for BERT/GPT2/XLNet fine-tuning).

    python scripts/recsys_gpt_trace.py --out data/recsys/cpu/gpt/d128-b8 --d-model 128 --batch 8

Each rank: `warmup` iterations, then `iterations` timed ones (a barrier opens each, as in the paper's setup;
the median of the slowest rank is the measured iteration), half of them before and half after one iteration
under torch.profiler with the ExecutionTraceObserver (rank<R>.et.json.gz and rank<R>.kineto.json.gz), so the
untraced iterations bracket the traced one in time. DDP with its default 25 MB buckets (the paper keeps the
default). measured.json holds the timed iterations, the traced iteration's own wall time per rank, and measure.phase's
reference probe (thread CPU time) just before the barrier and just after the step of every timed and the traced
iteration: the host's speed phase at each (docs/recommendation.md, fourteenth session), and the load average.
"""

import argparse
import gzip
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.spawn import spawn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

from trainsim.measure.phase import ReferenceProbe

WORLD_SIZE = 2
VOCAB = 2048


class TinyGpt(nn.Module):
    """Token + position embeddings, pre-norm causal transformer blocks (torch's TransformerEncoderLayer with a
    causal mask), a final norm and the LM head."""

    def __init__(self, d_model: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, d_model)
        self.positions = nn.Embedding(seq, d_model)
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        return self.head(self.norm(self.blocks(x, mask=self.mask, is_causal=True)))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, port: int, workdir: str, cfg: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyGpt(cfg["d_model"], cfg["layers"], cfg["heads"], cfg["seq"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    generator = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]), generator=generator)
    targets = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]), generator=generator)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(ids).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()

    probe = ReferenceProbe()

    def timed() -> tuple[float, float, float]:
        before = probe.time_s()
        dist.barrier()
        start = time.perf_counter()
        step()
        elapsed = time.perf_counter() - start
        return elapsed, before, probe.time_s()

    for _ in range(cfg["warmup"]):
        timed()
    runs = [timed() for _ in range(cfg["iterations"] // 2)]
    et_path, kineto_path = Path(workdir) / f"rank{rank}.et.json", Path(workdir) / f"rank{rank}.kineto.json"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=0, active=1),
                 record_shapes=True, execution_trace_observer=observer,
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(kineto_path))) as prof:
        dist.barrier()
        step()
        traced_before = probe.time_s()  # outside the recorded step: its ops are no part of the trace
        prof.step()
        dist.barrier()
        start = time.perf_counter()
        step()
        traced_s = time.perf_counter() - start
        prof.step()  # ends the recorded ProfilerStep and exports it
    traced = (traced_s, traced_before, probe.time_s())
    observer.unregister_callback()
    runs += [timed() for _ in range(cfg["iterations"] - cfg["iterations"] // 2)]
    (Path(workdir) / f"rank{rank}.times.json").write_text(json.dumps(
        {"times": [r[0] for r in runs], "probes": [r[1:] for r in runs], "traced": traced}))
    dist.barrier()
    dist.destroy_process_group()


def _compact(source: Path, target: Path) -> None:
    with gzip.open(target.with_name(target.name + ".gz"), "wt", compresslevel=6) as handle:
        handle.write(json.dumps(json.loads(source.read_text()), separators=(",", ":")))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    for name, default in (("d-model", 128), ("layers", 2), ("heads", 4), ("seq", 64), ("batch", 8),
                          ("warmup", 5), ("iterations", 30)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    cfg = {k: getattr(args, k) for k in ("d_model", "layers", "heads", "seq", "batch", "warmup", "iterations")}
    workdir = tempfile.mkdtemp(prefix="trainsim-gpt-")
    load_before = os.getloadavg()
    try:
        spawn(_worker, args=(_free_port(), workdir, cfg), nprocs=WORLD_SIZE, join=True)
        args.out.mkdir(parents=True, exist_ok=True)
        ranks = [json.loads((Path(workdir) / f"rank{r}.times.json").read_text()) for r in range(WORLD_SIZE)]
        times = [r["times"] for r in ranks]
        slowest = sorted(max(per_rank) for per_rank in zip(*times, strict=True))
        (args.out / "measured.json").write_text(json.dumps({
            "config": cfg, "rank_iterations_s": times, "iteration_s": slowest[len(slowest) // 2],
            "rank_probes_s": [r["probes"] for r in ranks], "rank_traced_s": [r["traced"][0] for r in ranks],
            "rank_traced_probes_s": [r["traced"][1:] for r in ranks], "load_before": load_before,
            "load_after": os.getloadavg()}))
        for rank in range(WORLD_SIZE):
            for kind in ("et", "kineto"):
                _compact(Path(workdir) / f"rank{rank}.{kind}.json", args.out / f"rank{rank}.{kind}.json")
        print(f"{args.out}: measured {slowest[len(slowest) // 2] * 1e3:.2f} ms (median of the slowest rank)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
