"""Per-op tp plans of a small GPT measured on this machine's gloo ranks against `trainsim predict --tree F --engine
sim` (docs/strategy-tree.md, "Model-parallel splits other than Megatron's", sixteenth to eighteenth sessions).

The model is the Table IV analogue's GPT-2 (data/strategies/proteus/small/models/gpt2-small.yaml: 4 layers of 256,
4 heads, vocabulary 4096, tied), micro-batch 4 x 128 tokens, fp32, one intra-op thread per rank. The plans: plain
Megatron tp 2 (`--tp 2`, no tree) and the trees data/strategies/megatron/gpt-small-tp2-*.yaml on 2 ranks, plain
tp 4 and gpt-small-tp4-mlp-tp2.yaml on 4; the seventeenth session's splits other than Megatron's
(gpt-small-tp2-{qkv-reduce,attn-seq,mlp-tokens,norms-seq}.yaml, measure/op_splits.py) on 2; the eighteenth's
norms and adds by features and adds by tokens (gpt-small-tp2-{norms-features,adds-features,adds-seq}.yaml,
measure/hidden_splits.py) on 2. Steps, each timed one under the timing lock:

    flock /tmp/trainsim-timing.lock python scripts/op_tp_ground_truth.py --profile --out OUT     # ops, collectives
    flock /tmp/trainsim-timing.lock python scripts/op_tp_ground_truth.py --measure --out OUT     # one pass; repeat
    python scripts/op_tp_ground_truth.py --summary --out OUT                                      # predict, compare

--profile: `trainsim profile` of the model's ops at tp 1, 2 and 4 (every per-op shape the plans run: an op at
degree d has the tp=d graph's shape) on thread CPU time, the Adam step at those three sizes, and the gloo
collectives of 2 and 4 ranks twice: on the busiest rank's process CPU (calls of 16 after 2 ms of compute, the Table
IV sweep's settings) into OUT/profile-cpu.db, and on the wall clock into OUT/profile-wall.db (the same ops).
--measure: every plan of --plans once, in order (`trainsim measure`, --iterations after --warmup), appended to
OUT/runs/ as "<plan>-HHMMSS".
--summary: per plan the medians over its runs of the median iteration (rank 0's wall clock between barriers) and
of the busiest rank's process CPU per step (less the harness' barriers), against `trainsim predict --engine sim`
with profiled costs (CPU database against CPU, wall database against wall) and with the default costs; per
plan its CPU over that of the plain run of the same pass. --after HHMMSS keeps the runs stamped from then on,
--suffix names the summary files. --dtensor-overhead and --core-costs time single modules (thread CPU).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "strategies" / "proteus" / "small" / "models" / "gpt2-small.yaml"
TREES = ROOT / "data" / "strategies" / "megatron"
MICRO_BATCH, SEQ_LEN = 4, 128
# plan -> (tp, tree file or None: plain Megatron tp)
PLANS: dict[str, tuple[int, str | None]] = {
    "tp2 plain": (2, None), "tp2 attn-only": (2, "gpt-small-tp2-attn-only.yaml"),
    "tp2 mlp-only": (2, "gpt-small-tp2-mlp-only.yaml"), "tp2 qkv-gather": (2, "gpt-small-tp2-qkv-gather.yaml"),
    "tp2 vocab-whole": (2, "gpt-small-tp2-vocab-whole.yaml"),
    "tp4 plain": (4, None), "tp4 mlp-tp2": (4, "gpt-small-tp4-mlp-tp2.yaml"),
    # seventeenth session: the splits other than Megatron's (measure/op_splits.py)
    "tp2 qkv-reduce": (2, "gpt-small-tp2-qkv-reduce.yaml"), "tp2 attn-seq": (2, "gpt-small-tp2-attn-seq.yaml"),
    "tp2 mlp-tokens": (2, "gpt-small-tp2-mlp-tokens.yaml"), "tp2 norms-seq": (2, "gpt-small-tp2-norms-seq.yaml"),
    # eighteenth session: the norms and the adds by features, the adds by tokens (measure/hidden_splits.py)
    "tp2 norms-features": (2, "gpt-small-tp2-norms-features.yaml"),
    "tp2 adds-features": (2, "gpt-small-tp2-adds-features.yaml"), "tp2 adds-seq": (2, "gpt-small-tp2-adds-seq.yaml"),
}
SIZES = "1KiB,16KiB,128KiB,512KiB,1MiB,2MiB,4MiB,8MiB,16MiB"  # the plans move 2 KiB (statistics) to 8 MiB (logits)


def job_flags(tp: int, cluster: str = "local-cpu") -> list[str]:
    return ["--model", str(MODEL), "--cluster", cluster, "--tp", str(tp), "--num-gpus", str(tp),
            "--micro-batch", str(MICRO_BATCH), "--global-batch", str(MICRO_BATCH), "--seq-len", str(SEQ_LEN),
            "--precision", "fp32"]


def trainsim(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"trainsim {' '.join(args)} failed: {done.stderr.strip()[-400:]}")
    return done.stdout


def profile(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for db in ("profile-cpu.db", "profile-wall.db"):
        for tp in (1, 2, 4):
            trainsim("profile", "--model", str(MODEL), "--precision", "fp32", "--micro-batch", str(MICRO_BATCH),
                     "--seq-len", str(SEQ_LEN), "--tp", str(tp), "--threads", "1", "--device", "cpu",
                     "--no-collectives", "--db", str(out / db))
    for ranks in (2, 4):
        trainsim("profile", "--no-ops", "--no-optimizer", "--world-size", str(ranks), "--sizes", SIZES, "--threads",
                 "1", "--device", "cpu", "--collective-clock", "cpu", "--calls-per-sample", "16",
                 "--collective-gap-ms", "2", "--db", str(out / "profile-cpu.db"))
        trainsim("profile", "--no-ops", "--no-optimizer", "--world-size", str(ranks), "--sizes", SIZES, "--threads",
                 "1", "--device", "cpu", "--db", str(out / "profile-wall.db"))


def measure(out: Path, iterations: int, warmup: int, plans: list[str]) -> None:
    runs = out / "runs"
    for plan in plans:
        tp, tree = PLANS[plan]
        run_id = f"{plan.replace(' ', '-')}-{time.strftime('%H%M%S')}"
        tree_flags = ["--tree", str(TREES / tree)] if tree else []
        trainsim("measure", *job_flags(tp), *tree_flags, "--iterations", str(iterations), "--warmup", str(warmup),
                 "--out", str(runs), "--run-id", run_id, "--json")
        print(f"measured {run_id}", file=sys.stderr)


def _runs(out: Path, plan: str, after: str = "", before: str = "999999") -> list[dict[str, Any]]:
    """The plan's runs (run id "<plan>-HHMMSS"), those stamped at or after `after` and before `before` (HHMMSS)
    where given."""
    prefix = plan.replace(" ", "-") + "-"
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob(f"{prefix}*.json"))
            if p.stem[len(prefix):].isdigit() and after <= p.stem[len(prefix):] < before]


def ratios_to_plain(out: Path, plan: str, after: str = "", before: str = "999999") -> list[float]:
    """Per run of the plan, its busiest rank's CPU per step over that of the plain run of its tp measured last
    before it (the same pass: --measure runs plain first)."""
    tp = PLANS[plan][0]
    plain = {r["run_id"]: r for r in _runs(out, f"tp{tp} plain", after, before)}
    out_ratios = []
    for run in _runs(out, plan, after, before):
        earlier = [k for k in plain if k[-6:] <= run["run_id"][-6:]]
        if earlier:
            out_ratios.append(busiest_cpu_s(run) / busiest_cpu_s(plain[max(earlier, key=lambda k: k[-6:])]))
    return out_ratios


def busiest_cpu_s(run: dict[str, Any]) -> float:
    s = run["settings"]
    steps = len(run["iteration_times_s"])
    return max(c - b for c, b in zip(s["cpu_s_per_rank"], s["barrier_cpu_s_per_rank"], strict=True)) / steps


def predicted(tp: int, tree: str | None, costs: list[str], cluster: str = "local-cpu") -> dict[str, Any]:
    tree_flags = ["--tree", str(TREES / tree)] if tree else []
    return json.loads(trainsim("predict", *job_flags(tp, cluster), "--engine", "sim", *tree_flags, *costs, "--json"))


def thread_cpu_s(run: dict[str, Any]) -> float:
    """The busiest rank's training thread alone per step (no gloo threads)."""
    return max(run["settings"]["thread_cpu_s_per_rank"]) / len(run["iteration_times_s"])


def summary(out: Path, after: str = "", cluster: str = "local-cpu", before: str = "999999",
            cpu_db: Path | None = None) -> list[dict[str, Any]]:
    """cluster: the one the predictions take (local-cpu: each rank a node of its own, its collectives on the
    catalog's placeholder link; local-cpu-ranks: the ranks one node, their collectives on the profiled curves).
    cpu_db: the CPU-clock database the predictions read (default OUT/profile-cpu.db)."""
    cpu_db = cpu_db or out / "profile-cpu.db"
    rows = []
    for plan, (tp, tree) in PLANS.items():
        runs = _runs(out, plan, after, before)
        if not runs:
            continue
        cpu = predicted(tp, tree, ["--costs", "profiled", "--db", str(cpu_db)], cluster)
        ratios = ratios_to_plain(out, plan, after, before)
        rows.append({
            "cpu_ratio_to_plain": statistics.median(ratios) if ratios else None,
            "cpu_ratios_to_plain": [round(r, 3) for r in ratios],
            "plan": plan, "runs": len(runs),
            "wall_s": statistics.median(statistics.median(r["iteration_times_s"]) for r in runs),
            "cpu_s": statistics.median(busiest_cpu_s(r) for r in runs),
            "cpu_s_per_run": [round(busiest_cpu_s(r), 4) for r in runs],
            "thread_cpu_s": statistics.median(thread_cpu_s(r) for r in runs),
            "load": [round(r["settings"]["load_average_1m"][0], 1) for r in runs],
            "predicted_cpu_s": cpu["iteration_time_s"],
            "predicted_tp_comm_cpu_s": cpu["breakdown"]["tp_comm"],
            # DTensor's per-layer cost (profile/framework) and the reshards' host cost (Pricer.reshard_host_s)
            "predicted_overhead_cpu_s": cpu["breakdown"]["overhead"],
            "predicted_wall_s": predicted(tp, tree, ["--costs", "profiled", "--db", str(out / "profile-wall.db")],
                                          cluster)["iteration_time_s"],
            "predicted_default_s": predicted(tp, tree, [])["iteration_time_s"],
        })
    return rows


def _order(rows: list[dict[str, Any]], key: str) -> list[str]:
    return [r["plan"] for r in sorted(rows, key=lambda r: r[key])]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| plan | runs | measured wall (median) | predicted, wall db | error | measured CPU/step (busiest "
             "rank; min-max over runs) | predicted, CPU db | error | training thread / predicted less tp_comm | "
             "of which host overhead (DTensor per layer, reshards) | predicted, default costs | load (1 min) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        wall_err = r["predicted_wall_s"] / r["wall_s"] - 1
        cpu_err = r["predicted_cpu_s"] / r["cpu_s"] - 1
        spread = f"{min(r['cpu_s_per_run']) * 1e3:.0f}-{max(r['cpu_s_per_run']) * 1e3:.0f}"
        compute_s = r["predicted_cpu_s"] - r["predicted_tp_comm_cpu_s"]
        lines.append(f"| {r['plan']} | {r['runs']} | {r['wall_s'] * 1e3:.1f} ms | {r['predicted_wall_s'] * 1e3:.1f} ms"
                     f" | {wall_err:+.1%} | {r['cpu_s'] * 1e3:.1f} ms ({spread}) | {r['predicted_cpu_s'] * 1e3:.1f} ms"
                     f" | {cpu_err:+.1%} | {r['thread_cpu_s'] * 1e3:.1f} / {compute_s * 1e3:.1f} ms | "
                     f"{r.get('predicted_overhead_cpu_s', 0.0) * 1e3:.1f} ms | "
                     f"{r['predicted_default_s'] * 1e3:.1f} ms | {', '.join(map(str, r['load']))} |")
    lines += ["", "| plan | measured CPU / plain's, same pass (median; min-max) | predicted / plain's (CPU db) |",
              "|---|---:|---:|"]
    plains = {r["plan"].split()[0]: r for r in rows if r["plan"].endswith("plain")}
    for r in rows:
        plain = plains.get(r["plan"].split()[0])
        if plain is None or r is plain or not r["cpu_ratios_to_plain"]:
            continue
        lines.append(f"| {r['plan']} | {r['cpu_ratio_to_plain']:.3f} ({min(r['cpu_ratios_to_plain']):.2f}-"
                     f"{max(r['cpu_ratios_to_plain']):.2f}) | {r['predicted_cpu_s'] / plain['predicted_cpu_s']:.3f} |")
    for ranks in ("tp2", "tp4"):
        group = [r for r in rows if r["plan"].startswith(ranks)]
        for measured, predicted in (("wall_s", "predicted_wall_s"), ("cpu_s", "predicted_cpu_s"),
                                    ("cpu_s", "predicted_default_s")):
            same = _order(group, measured) == _order(group, predicted)
            lines.append(f"\n{ranks} order by {measured}: {' < '.join(_order(group, measured))}; by {predicted}: "
                         f"{' < '.join(_order(group, predicted))} ({'same' if same else 'differs'})")
    return "\n".join(lines) + "\n"


def _megatron_mappings() -> tuple[Any, Any]:
    """Megatron-LM's explicit f and g operators (megatron/core/tensor_parallel/mappings.py, copy_to / reduce_from
    the tensor-parallel region; Shoeybi et al. 2019, Sec. 3): identity forward and all-reduce backward, and the
    converse, on the default group."""
    import torch
    import torch.distributed as dist

    class CopyToRegion(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            grad = grads[0].contiguous()
            dist.all_reduce(grad)
            return grad

    class ReduceFromRegion(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            return grads[0]

    return CopyToRegion, ReduceFromRegion


def dtensor_overhead(calls: int = 200) -> dict[str, float]:
    """Thread CPU seconds of one forward and backward of the plans' matmul shapes (a [4, 128, 256] input) as a
    plain nn.Linear, as torch.distributed.tensor.parallel's ColwiseParallel / RowwiseParallel module (and the
    RowwiseParallel of a qkv split by reduce: input and output Shard(-1)) over a 1-rank mesh (the same local
    matmul: what the DTensor wrapping adds per module), and on the explicit collectives of measure/op_collectives.py
    over a 1-rank group (a slice before it and an all-gather after it, as an MLP split by tokens runs: what
    autograd functions and plain gloo calls add) and as Megatron-LM's explicit column / row parallel linear (the f
    operator before it, the g operator after it: one all-reduce each, as ColwiseParallel and RowwiseParallel
    have), medians of `calls` taken round robin, on that input and on a [1, 1, 256] one (the fixed cost)."""
    import torch
    import torch.distributed as dist
    from torch.distributed import HashStore  # pyright: ignore[reportPrivateImportUsage]  # NB: public, torch 2.x docs
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from trainsim.measure.op_collectives import Group, slice_part
    from trainsim.measure.op_splits import gather_output

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        group = Group(mesh.get_group(), 1, 0)
        copy_to, reduce_from = _megatron_mappings()
        styles = {"plain": None, "colwise": ColwiseParallel(), "rowwise": RowwiseParallel(),
                  "rowwise_shard": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(-1)),
                  "explicit": "explicit", "colwise_explicit": "f", "rowwise_explicit": "g"}
        holders = {}
        for name, style in styles.items():
            holder = torch.nn.Sequential(torch.nn.Linear(256, 256))
            if isinstance(style, (ColwiseParallel, RowwiseParallel)):
                parallelize_module(holder, mesh, {"0": style})
            elif style == "explicit":
                holder.register_forward_pre_hook(lambda _m, args: (slice_part(args[0], group, 1),))
                holder.register_forward_hook(gather_output(group))
            elif style == "f":
                holder.register_forward_pre_hook(lambda _m, args: (copy_to.apply(args[0]),))
            elif style == "g":
                holder.register_forward_hook(lambda _m, _i, y: reduce_from.apply(y))
            holders[name] = holder
        out: dict[str, float] = {}
        for shape in ((MICRO_BATCH, SEQ_LEN, 256), (1, 1, 256)):
            x = torch.randn(*shape, requires_grad=True)
            samples: dict[str, list[float]] = {name: [] for name in holders}
            for i in range(calls + 20):  # round robin: the machine's drift touches every variant alike
                for name, holder in holders.items():
                    began = time.thread_time()
                    holder(x).sum().backward()
                    if i >= 20:
                        samples[name].append(time.thread_time() - began)
            out.update({f"{name}[{'x'.join(map(str, shape))}]": statistics.median(v) for name, v in samples.items()})
        return out
    finally:
        dist.destroy_process_group()


def core_costs(calls: int = 100) -> dict[str, float]:
    """Thread CPU seconds of one forward and backward of the small GPT's attention core per rank (4 heads of 64, 128
    tokens, micro-batch 4, causal): plain tp 2's (2 heads, the whole sequence, is_causal) against the core by query
    rows on 2 ranks (4 heads, each zig-zag row chunk against the keys up to its last row under a boolean mask,
    measure/op_splits.py) for rank 0 (chunks 0 and 3) and rank 1 (chunks 1 and 2), medians of `calls`."""
    import torch

    from trainsim.measure.model import Attention
    from trainsim.measure.op_splits import _rows_core

    torch.set_num_threads(1)
    batch, heads, head_dim = MICRO_BATCH, 4, 64
    attn = Attention.__new__(Attention)  # only the flags _rows_core reads
    object.__setattr__(attn, "causal", True)
    object.__setattr__(attn, "position", "learned")

    def heads_split() -> None:
        q, k, v = (torch.randn(batch, heads // 2, SEQ_LEN, head_dim, requires_grad=True) for _ in range(3))
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    def rows(rank: int) -> None:
        chunk = SEQ_LEN // 4
        mine = torch.cat([torch.arange(chunk) + chunk * rank, torch.arange(chunk) + chunk * (3 - rank)])
        q = torch.randn(batch, heads, 2 * chunk, head_dim, requires_grad=True)
        k, v = (torch.randn(batch, heads, SEQ_LEN, head_dim, requires_grad=True) for _ in range(2))
        _rows_core(attn, q, k, v, mine).sum().backward()

    out: dict[str, float] = {}
    for name, fn in (("heads_split", heads_split), ("rows_rank0", lambda: rows(0)), ("rows_rank1", lambda: rows(1))):
        samples = []
        for i in range(calls + 10):
            began = time.thread_time()
            fn()
            if i >= 10:
                samples.append(time.thread_time() - began)
        out[name] = statistics.median(samples)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "op_tp_ground_truth")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--dtensor-overhead", action="store_true", help="time a matmul's forward and backward "
                        "plain and as a DTensor-parallel module on one rank (thread CPU)")
    parser.add_argument("--plans", default=",".join(PLANS), help="the plans --measure runs, comma-separated "
                        f"(default all: {', '.join(PLANS)})")
    parser.add_argument("--core-costs", action="store_true", help="time the attention core's forward and "
                        "backward heads-split (plain tp 2) and by query rows (thread CPU)")
    parser.add_argument("--after", default="", help="--summary of the runs stamped at or after HHMMSS only")
    parser.add_argument("--cpu-db", type=Path, default=None, help="--summary predicts the CPU clock from this "
                        "database (default OUT/profile-cpu.db)")
    parser.add_argument("--before", default="999999", help="--summary of the runs stamped before HHMMSS only")
    parser.add_argument("--suffix", default="", help="--summary writes summary<SUFFIX>.md and .json")
    parser.add_argument("--predict-cluster", default="local-cpu", help="--summary predicts on this cluster "
                        "(local-cpu-ranks: the ranks one node, their collectives priced by the profiled curves)")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.profile:
        profile(args.out)
    if args.measure:
        plans = args.plans.split(",")
        if unknown := [p for p in plans if p not in PLANS]:
            raise SystemExit(f"--plans: {', '.join(unknown)} unknown; choose from {', '.join(PLANS)}")
        measure(args.out, args.iterations, args.warmup, plans)
    if args.dtensor_overhead:
        print(json.dumps({k: round(v * 1e6, 1) for k, v in dtensor_overhead().items()}) + " (us per forward and "
              "backward, thread CPU)")
    if args.core_costs:
        print(json.dumps({k: round(v * 1e6, 1) for k, v in core_costs().items()}) + " (us per forward and backward, "
              "thread CPU)")
    if args.summary:
        rows = summary(args.out, args.after, args.predict_cluster, args.before, args.cpu_db)
        (args.out / f"summary{args.suffix}.json").write_text(json.dumps(rows, indent=1))
        text = markdown(rows)
        (args.out / f"summary{args.suffix}.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
