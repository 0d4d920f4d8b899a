"""A DLRM of a generated task (embedding.synthetic, Lin et al. Sec. IV-B1) trained on one GPU, against trainsim's
prediction of the same job (docs/recommendation.md, "One GPU, end to end").

    python scripts/gpu/dlrm_one_gpu.py measure OUT.jsonl [--device cuda]   # on the GPU (or cpu, to try it)
    python scripts/gpu/dlrm_one_gpu.py predict OUT.jsonl CLUSTER LOOKUP.json   # here: each config predicted

The model is the one `trainsim measure` trains on gloo ranks (measure/dlrm_rank.py) on a single rank, so with no
all-to-all: every table on the device as torch.nn.EmbeddingBag(mode="sum", sparse=True) with the sparse SGD
update, the bottom MLP, the dot interaction, the top MLP and BCE loss, SGD on the dense weights. Per config:
the wall-clock iteration (synchronized, median of the timed ones; the host's eager launches and the sparse
update's synchronisations included) and the GPU's own time of one iteration per phase (the sum of its kernels'
durations, profile.embedding's kernel clock): lookups forward, dense forward and backward, lookups backward with
their update, dense step. Rows are appended as they are measured (a run cut short keeps them).
"""

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.embedding.indices import popularity_cdf, sample_batch
from trainsim.embedding.tables import Table
from trainsim.measure.dlrm_rank import dense_mlp

KINDS = ("heavy", "normal")
SEEDS = (0, 1, 2, 3, 4)
BATCHES = (2048, 8192)  # the paper's GPU runs: 4096 per GPU
LR = 0.01


def _tables(kind: str, seed: int) -> tuple[Any, tuple[Table, ...]]:
    from trainsim.cli.shard import synthetic_model

    spec = synthetic_model(kind, 1, seed)
    tables = tuple(Table(i, t.rows, t.dim, t.pooling_factor, t.zipf_alpha) for i, t in enumerate(spec.tables))
    return spec, tables


def _inputs(torch: Any, tables: tuple[Table, ...], batch: int, seed: int, device: str) -> list[tuple[Any, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for t in tables:
        lengths, indices = sample_batch(t, batch, rng, popularity_cdf(t.rows, t.zipf_alpha) if t.zipf_alpha else None)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        out.append((torch.from_numpy(indices).to(device), torch.from_numpy(offsets).to(device)))
    return out


def measure_config(kind: str, seed: int, batch: int, device: str, iterations: int = 10) -> dict[str, Any]:
    import torch

    from trainsim.profile.embedding import clock_for_device

    torch.manual_seed(seed)
    spec, tables = _tables(kind, seed)
    dim = tables[0].dim
    bags = [torch.nn.EmbeddingBag(t.rows, t.dim, mode="sum", sparse=True, device=device) for t in tables]
    bottom = dense_mlp(torch, [spec.dense_features, *spec.bottom_mlp], False).to(device)
    features = len(tables) + 1
    top = dense_mlp(torch, [features * (features - 1) // 2 + dim, *spec.top_mlp], True).to(device)
    dense_params = list(bottom.parameters()) + list(top.parameters())
    lower = torch.tril_indices(features, features, offset=-1, device=device)
    batches = [_inputs(torch, tables, batch, seed * 1009 + k, device) for k in range(2)]
    dense_x = torch.randn(batch, spec.dense_features, device=device)
    labels = torch.randint(0, 2, (batch, 1), device=device).float()

    def lookups_fwd(k: int) -> list[Any]:
        return [bag(idx, off) for bag, (idx, off) in zip(bags, batches[k], strict=True)]

    def dense_fwd_bwd(pooled: list[Any]) -> list[Any]:
        leaves = [p.detach().requires_grad_(True) for p in pooled]
        bottom_out = bottom(dense_x)
        stacked = torch.stack([bottom_out, *leaves], 1)
        z = torch.bmm(stacked, stacked.transpose(1, 2))[:, lower[0], lower[1]]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(top(torch.cat([bottom_out, z], 1)), labels)
        loss.backward()
        return [leaf.grad for leaf in leaves]

    def lookups_bwd(pooled: list[Any], grads: list[Any]) -> None:
        for bag, out, grad in zip(bags, pooled, grads, strict=True):
            out.backward(grad)
            weight_grad = bag.weight.grad
            assert weight_grad is not None
            with torch.no_grad():
                bag.weight.add_(weight_grad, alpha=-LR)
            bag.weight.grad = None

    def dense_step() -> None:
        with torch.no_grad():
            for q in dense_params:
                q.add_(q.grad, alpha=-LR)
                q.grad = None

    def iteration(k: int) -> None:
        pooled = lookups_fwd(k)
        lookups_bwd(pooled, dense_fwd_bwd(pooled))
        dense_step()

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for k in range(3):
        iteration(k % 2)
    walls = []
    for k in range(iterations):
        sync()
        start = time.perf_counter()
        iteration(k % 2)
        sync()
        walls.append(time.perf_counter() - start)
    clock = clock_for_device(device)
    pooled, fwd_s = clock.time_s(lambda: lookups_fwd(0))
    grads, dense_s = clock.time_s(lambda: dense_fwd_bwd(pooled))
    _, bwd_s = clock.time_s(lambda: lookups_bwd(pooled, grads))
    _, step_s = clock.time_s(dense_step)
    return {"kind": kind, "seed": seed, "batch": batch, "tables": len(tables), "dim": dim,
            "lookups": int(sum(idx.numel() for idx, _ in batches[0])), "wall_s": statistics.median(walls),
            "walls_s": walls, "phases_s": {"lookups_fwd": fwd_s, "dense_fwd_bwd": dense_s,
                                           "lookups_bwd": bwd_s, "dense_step": step_s}}


def measure(out: Path, device: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for batch in BATCHES:
        for seed in SEEDS:
            for kind in KINDS:
                row = measure_config(kind, seed, batch, device)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                kernels = sum(row["phases_s"].values())
                print(f"{kind} s{seed} b{batch}: wall {row['wall_s'] * 1e3:.3f} ms, kernels {kernels * 1e3:.3f} ms",
                      flush=True)
                if device == "cuda":
                    import torch

                    torch.cuda.empty_cache()


def _lookups_s(plan: Any, batch: int, lookups: Any) -> tuple[float, float]:
    """The lookup model's forward and backward seconds of every table on the one rank of `plan`."""
    pieces = plan.pieces(batch)[0]
    return sum(lookups.lookup_s(p, "fwd") for p in pieces), sum(lookups.lookup_s(p, "bwd") for p in pieces)


def _summary(name: str, errors: list[float]) -> str:
    magnitudes = np.abs(errors)
    return (f"{name}: geomean |error| {float(np.exp(np.mean(np.log(magnitudes)))) * 100:.1f}%, mean "
            f"{float(np.mean(magnitudes)) * 100:.1f}%, max {float(np.max(magnitudes)) * 100:.1f}%, median signed "
            f"{float(np.median(errors)) * 100:+.1f}%")


def predict(out: Path, cluster_name: str, lookup: str) -> None:
    from trainsim.catalog import load_cluster
    from trainsim.cli.shard import lookup_model, synthetic_model
    from trainsim.search.sharding import compare_sharders

    cluster = load_cluster(cluster_name)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    errors: dict[str, list[float]] = {"lookups forward (kernels)": [], "lookups backward (kernels)": [],
                                      "iteration (kernels)": [], "iteration (wall)": []}
    print(f"{'config':<18} {'wall':>7} {'kernels':>8} {'predicted':>9}   lookups fwd meas/pred   lookups bwd meas/pred"
          "   (ms)")
    for row in rows:
        spec = synthetic_model(row["kind"], 1, row["seed"])
        lookups = lookup_model(lookup, cluster, row["seed"])
        report = compare_sharders(spec, cluster, 1, row["batch"], lookups=lookups, sharders=("naive",))
        best = report.best
        if best is None or best.result is None or best.plan is None:
            print(f"{row['kind']} s{row['seed']} b{row['batch']}: not predicted ({report.outcomes[0].refused})")
            continue
        predicted = best.result.iteration_time_s
        phases = row["phases_s"]
        kernels = sum(phases.values())
        fwd_s, bwd_s = _lookups_s(best.plan, row["batch"], lookups)
        for key, measured, priced in (("lookups forward (kernels)", phases["lookups_fwd"], fwd_s),
                                      ("lookups backward (kernels)", phases["lookups_bwd"], bwd_s),
                                      ("iteration (kernels)", kernels, predicted),
                                      ("iteration (wall)", row["wall_s"], predicted)):
            errors[key].append(priced / measured - 1)
        print(f"{row['kind']} s{row['seed']} b{row['batch']:<6} {row['wall_s'] * 1e3:7.3f} {kernels * 1e3:8.3f} "
              f"{predicted * 1e3:9.3f}   {phases['lookups_fwd'] * 1e3:8.3f} / {fwd_s * 1e3:8.3f}   "
              f"{phases['lookups_bwd'] * 1e3:8.3f} / {bwd_s * 1e3:8.3f}")
    for key, values in errors.items():
        if values:
            print(_summary(key, values))


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("measure", "predict") or (sys.argv[1] == "predict"
                                                                         and len(sys.argv) != 5):
        raise SystemExit(__doc__)
    out = Path(sys.argv[2])
    if sys.argv[1] == "measure":
        measure(out, sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--device" else "cuda")
    else:
        predict(out, sys.argv[3], sys.argv[4])


if __name__ == "__main__":
    main()
