"""On-machine acceptance of the profiler (issue 4): profile a small GPT, predict its training step from the
profile, run the same step in real PyTorch, and compare.

For each precision (fp32 and amp-bf16 = torch.autocast("cpu", dtype=torch.bfloat16)):
  1. profile every unique op of the job's OpGraph (and the Adam step) into a temporary profile database, in
     --passes passes interleaved with the real steps of 3. (the machine is shared: both see the same load),
  2. predict one single-process training step (dp = tp = pp = 1 on the local-cpu cluster) with the analytical
     engine on profiled costs and with the precision-aware engine (seed 001) on the same database,
  3. build the model in plain PyTorch (embedding, pre-LN blocks with causal SDPA and a GELU MLP, tied head,
     cross-entropy; Adam), time the whole step (zero_grad, forward, backward, optimizer step) and report the
     median of --iterations steps after --warmup steps, on the profiler's clock (with one thread: the thread's
     CPU time, which other processes' use of the core does not inflate; wall time is reported beside it),
and print predicted vs measured and the error. Target: |error| <= 10% for both precisions.

Usage: python benchmarks/profile_small_gpt.py [--threads 1] [--iterations 20] [--json]
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainsim.catalog import load_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.cost.profiled import ProfiledCosts
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.engines import make_engine
from trainsim.estimate.precision_aware import PrecisionAwareEstimator
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.profile.database import ProfileDB
from trainsim.profile.job import profile_job
from trainsim.profile.ops import clock_for, local_environment
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision, policy_for

SMALL_GPT: dict[str, Any] = {
    "name": "small-gpt", "arch": "gpt", "num_layers": 4, "hidden": 512, "num_heads": 8, "ffn_hidden": 2048,
    "vocab": 8192, "max_seq_len": 256, "mlp": "gelu", "norm": "layernorm", "position": "learned", "bias": True,
    "tied_embeddings": True, "causal": True,
}
MICRO_BATCH = 4
SEQ_LEN = 256
TARGET_ERROR = 0.10


def build_torch_gpt(spec: TransformerSpec) -> Any:
    """A straightforward GPT in PyTorch with the spec's shapes (nanoGPT-style, no dropout)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h = spec.hidden
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc1, self.fc2 = nn.Linear(h, spec.ffn_hidden), nn.Linear(spec.ffn_hidden, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            heads = spec.num_heads
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(spec.vocab, spec.hidden)
            self.wpe = nn.Embedding(spec.max_seq_len, spec.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(spec.num_layers))
            self.ln_f = nn.LayerNorm(spec.hidden)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    return GPT()


class RealStep:
    """The small GPT's training step in plain PyTorch: zero_grad, forward (under torch.autocast for amp-bf16),
    backward, Adam step; timed on the profiler's clock (thread CPU time with one thread), wall time beside."""

    def __init__(self, spec: TransformerSpec, precision: Precision) -> None:
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.model = build_torch_gpt(spec)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.idx = torch.randint(0, spec.vocab, (MICRO_BATCH, SEQ_LEN))
        self.targets = torch.randint(0, spec.vocab, (MICRO_BATCH, SEQ_LEN))
        self.amp = precision == "amp-bf16"
        self.clock, self.clock_name = clock_for("cpu")
        self.phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "step": [], "wall": []}

    def run(self, steps: int, record: bool = True) -> None:
        torch, clock = self.torch, self.clock
        for _ in range(steps):
            wall = time.perf_counter()
            start = clock()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp):
                loss = self.model(self.idx, self.targets)
            forward_end = clock()
            loss.backward()
            backward_end = clock()
            self.optimizer.step()
            end = clock()
            if record:
                for name, seconds in (("forward", forward_end - start), ("backward", backward_end - forward_end),
                                      ("optimizer", end - backward_end), ("step", end - start),
                                      ("wall", time.perf_counter() - wall)):
                    self.phases[name].append(seconds)

    def summary(self) -> dict[str, Any]:
        steps = sorted(self.phases["step"])
        return {"step_s": statistics.median(steps), "p10_s": steps[len(steps) // 10],
                "p90_s": steps[(len(steps) * 9) // 10], "iterations": len(steps), "clock": self.clock_name,
                **{f"{name}_s": statistics.median(values) for name, values in self.phases.items() if name != "step"}}


def run(precision: Precision, db_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Profile in passes interleaved with chunks of real steps, so that both see the same machine load (other
    processes share the cores and the last-level cache), then predict and compare."""
    spec = parse_model(SMALL_GPT)
    assert isinstance(spec, TransformerSpec)
    shape = DeviceSlice(MICRO_BATCH, SEQ_LEN, policy_for(precision))
    real = RealStep(spec, precision)
    real.run(args.warmup, record=False)
    env = local_environment("cpu-local", "cpu")
    per_chunk = -(-args.iterations // args.passes)
    profile_s = 0.0
    signatures = 0
    with ProfileDB.open(db_path) as db:
        for index in range(1, args.passes + 1):
            started = time.perf_counter()
            summary = profile_job(db, env, spec, shape, "cpu", warmup=args.profile_warmup,
                                  repeats=index * args.profile_repeats)
            signatures = summary.signatures
            profile_s += time.perf_counter() - started
            real.run(per_chunk)
    job = make_job(spec, load_cluster("local-cpu"),
                   ParallelSpec(micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, precision=precision, dp=1))
    graph = graph_for(job)
    analytical = make_engine("analytical", "profiled", db_path)
    predicted = analytical.estimate(job, graph)
    assert isinstance(analytical, AnalyticalEstimator)
    costs = analytical.pricer.op_costs
    assert isinstance(costs, ProfiledCosts)
    seed = PrecisionAwareEstimator(db=db_path).estimate(job, graph)
    measured = real.summary()
    error = predicted.iteration_time_s / measured["step_s"] - 1.0
    seed_error = seed.iteration_time_s / measured["step_s"] - 1.0
    return {"precision": precision, "threads": env.threads, "hardware": env.hardware, "versions": env.versions,
            "profiled_signatures": signatures, "profile_samples": args.passes * args.profile_repeats,
            "profile_s": profile_s, "predicted_s": predicted.iteration_time_s,
            "predicted_breakdown_s": predicted.breakdown, "sources": costs.source_counts(),
            "precision_aware_s": seed.iteration_time_s, "measured": measured, "error": error,
            "precision_aware_error": seed_error, "within_target": abs(error) <= TARGET_ERROR}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for profile and real step")
    parser.add_argument("--iterations", type=int, default=20, help="measured real steps (median)")
    parser.add_argument("--warmup", type=int, default=3, help="real steps before measuring")
    parser.add_argument("--passes", type=int, default=4, help="profile passes interleaved with real steps")
    parser.add_argument("--profile-warmup", type=int, default=1, help="untimed calls per op and pass")
    parser.add_argument("--profile-repeats", type=int, default=3, help="samples per op and pass")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "amp-bf16"])
    parser.add_argument("--db", type=Path, default=None, help="profile database (default: a temporary file)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        db_path = args.db or Path(tmp) / "profile.sqlite"
        rows = [run(precision, db_path, args) for precision in args.precisions]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"small GPT (4 x 512, 8 heads, vocab 8192), micro-batch {MICRO_BATCH} x {SEQ_LEN} tokens, "
              f"{rows[0]['hardware']}, {rows[0]['versions']}, {args.threads} thread(s)")
        print(f"{'precision':<10} {'predicted':>10} {'measured':>10} {'error':>8} {'seed-001':>10} {'error':>8}  "
              f"{'p10-p90':>11}  {'wall':>9}")
        for row in rows:
            real = row["measured"]
            print(f"{row['precision']:<10} {row['predicted_s'] * 1e3:8.1f}ms {real['step_s'] * 1e3:8.1f}ms "
                  f"{row['error']:+8.1%} {row['precision_aware_s'] * 1e3:8.1f}ms {row['precision_aware_error']:+8.1%}"
                  f"  {real['p10_s'] * 1e3:4.0f}-{real['p90_s'] * 1e3:4.0f}ms  {real['wall_s'] * 1e3:7.1f}ms")
        print(f"measured: median of {rows[0]['measured']['iterations']} steps on {rows[0]['measured']['clock']} "
              f"(wall: median wall-clock step); predicted: analytical engine on profiled costs; seed-001: the "
              "precision-aware engine on the same database")
    return 0 if all(row["within_target"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
