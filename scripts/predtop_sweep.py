"""PredTOP's MRE sweep (Tables V-VI) over prepared stage data, many fits at once, results streamed to JSONL.

    python scripts/predtop_sweep.py prepare --db DB --out data.pkl [--jax]   # DAGs + measured latencies
    python scripts/predtop_sweep.py run --data data.pkl --out runs.jsonl --workers 12 --device cuda
    python scripts/predtop_sweep.py summary --runs runs.jsonl                 # the tables (mean over seeds)
    python scripts/predtop_sweep.py prepare --gpu --db data/stages/h100/stages_gpu.db --out gpu.pkl.gz
    python scripts/predtop_sweep.py run --plan gpu --data gpu.pkl.gz --out gpu.jsonl   # the H100 stages

`run` takes the fits in priority order (every setting at 30% first, then the target variants, the other
fractions, more seeds, the jaxpr DAGs), so that a run stopped by a deadline keeps the most useful ones.
The same fits as `trainsim stages evaluate` (experiment.fit_one); this script only orders and streams them.
"""

import argparse
import gzip
import json
import pickle
import sys
from pathlib import Path
from typing import Any

from trainsim.search.predtop.experiment import (
    FRACTIONS,
    KINDS,
    Corpus,
    PoolRunner,
    Setting,
    TrainOptions,
    dag_builder,
    fit_one,
    noise_floor,
    setting_data,
    summarise,
)
from trainsim.strategy.stage_plan import IntraPlan, Mesh

sys.path.insert(0, str(Path(__file__).parent))
from stage_experiments import MICRO_BATCH, MODELS, SEQ_LEN

SETTINGS = [Setting(Mesh(1, d), IntraPlan(1, d)) for d in (1, 2, 4)]


def prepare(db_path: Path, out: Path, with_jax: bool, gpu: bool) -> None:
    """gpu: the H100 stage database (scripts/gpu/stages_gpu.py's models, mesh = 1 GPU, threads column 0)."""
    from trainsim.measure.stage_db import StageDatabase

    db = StageDatabase(db_path)
    data: dict[str, Any] = {}
    if gpu:
        from gpu.stages_gpu import GPU_THREADS
        from gpu.stages_gpu import MICRO_BATCH as GPU_MICRO_BATCH
        from gpu.stages_gpu import MODELS as GPU_MODELS
        from gpu.stages_gpu import SEQ_LEN as GPU_SEQ_LEN

        corpora = {name: Corpus(m, GPU_MICRO_BATCH, GPU_SEQ_LEN, GPU_THREADS) for name, m in GPU_MODELS.items()}
        settings = SETTINGS[:1]
    else:
        corpora = {name: Corpus(m, MICRO_BATCH, SEQ_LEN) for name, m in MODELS.items()}
        settings = SETTINGS
    for name, corpus in corpora.items():
        for source in ("torch", "jax") if with_jax else ("torch",):
            builder = dag_builder(corpus, source)
            for setting in settings:
                d = setting_data(db, corpus, setting, builder)
                if d.latencies_s:
                    data[f"{name}/{d.label}/{source}"] = d
                    print(name, d.label, source, len(d.latencies_s), f"floor {noise_floor(d):.2f}%", flush=True)
    out.write_bytes(gzip.compress(pickle.dumps(data)))


def plan(data: dict[str, Any], which: str = "cpu") -> list[tuple[str, str, float, int, str]]:
    """(data key, kind, fraction, seed, target) in priority order ("gpu": the H100 data on this machine's
    cores: 30% first, then 10% and 50%, seed 0)."""
    torch_keys = [k for k in data if k.endswith("/torch")]
    if which == "gpu":
        return [(k, kind, f, 0, "log") for f in (0.3, 0.1, 0.5) for k in torch_keys for kind in KINDS]
    jobs: list[tuple[str, str, float, int, str]] = []
    for seed in (0, 1, 2):
        jobs += [(k, kind, 0.3, seed, "log") for k in torch_keys for kind in KINDS]
    for seed in (0, 1, 2):
        jobs += [(k, "transformer", 0.3, seed, t) for k in torch_keys for t in ("relative", "absolute")]
    for seed in (0, 1):
        jobs += [(k, kind, f, seed, "log") for f in FRACTIONS if f != 0.3 for k in torch_keys for kind in KINDS]
    jobs += [(k, "transformer", 0.3, seed, "log") for seed in (0, 1) for k in data if k.endswith("/jax")]
    jobs += [(k, kind, f, 2, "log") for f in FRACTIONS if f != 0.3 for k in torch_keys for kind in KINDS]
    return jobs


def run(data_path: Path, out: Path, workers: int, device: str, epochs: int, patience: int, limit: int,
        which: str) -> None:
    data = pickle.loads(gzip.decompress(data_path.read_bytes()))
    jobs = plan(data, which)[:limit]
    devices = device.split(",")  # "cuda,cpu": the fits alternate between them (a GPU and the host's cores)
    items = [(kind, data[key].dags, data[key].latencies_s, fraction, seed,
              TrainOptions(epochs, patience, target, devices[i % len(devices)]))
             for i, (key, kind, fraction, seed, target) in enumerate(jobs)]
    print(f"{len(items)} fits on {workers} workers ({device})", flush=True)
    with out.open("a") as sink:
        for index, result in PoolRunner(workers).map(fit_one, items):
            key, _, _, _, target = jobs[index]
            sink.write(json.dumps({"key": key, "target": target, "device": items[index][5].device, **result}) + "\n")
            sink.flush()


def summary(runs_path: Path) -> dict[str, Any]:
    runs = [json.loads(line) for line in runs_path.read_text().splitlines() if line.strip()]
    out: dict[str, Any] = {}
    for key in sorted({r["key"] for r in runs}):
        for target in sorted({r["target"] for r in runs if r["key"] == key}):
            mine = [r for r in runs if r["key"] == key and r["target"] == target]
            out[f"{key}/{target}"] = summarise(mine)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["prepare", "run", "summary"])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", type=Path)
    parser.add_argument("--jax", action="store_true")
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--plan", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--patience", type=int, default=200)
    parser.add_argument("--limit", type=int, default=100_000)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.db, args.out, args.jax, args.gpu)
    elif args.command == "run":
        run(args.data, args.out, args.workers, args.device, args.epochs, args.patience, args.limit, args.plan)
    else:
        print(json.dumps(summary(args.runs), indent=1))


if __name__ == "__main__":
    main()
