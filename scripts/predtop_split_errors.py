"""Where one PredTOP split's test error comes from (`trainsim stages evaluate`'s fit_one, the same split, seed,
schedule and model): the split's make-up (stages with the head, with the embedding, lengths), the test MRE by
stage group and length, the worst test stages, and with --trace the validation loss and the test MRE after
every epoch (for diagnosis only: the epoch kept is still the one with the lowest validation loss).

    python scripts/predtop_split_errors.py --model data/stages/models/gpt-deep.yaml \
        --db data/stages/cpu/stages_cpu_deep_phase.db --mesh 1x1 --layers alpa --seed 0 --kind transformer \
        --epochs 150 --patience 60 --trace --out docs/data/predtop_split_errors.1x1.s0.transformer.json
    python scripts/predtop_split_errors.py ... --kind none      # the split's make-up only, nothing trained

Reads the database only; a stage "with the head" ends at the last unit, one "with the embedding" starts at 0.
For reference it also scores a four-number additive model (additive_baseline) fitted to the same training stages.
"""

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from trainsim.catalog import load_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import StageDatabase
from trainsim.search.predtop.experiment import (
    Corpus,
    SettingData,
    dag_builder,
    parse_settings,
    setting_data,
    with_layers,
)
from trainsim.search.predtop.train import Split, prepare, split, train


def group(stage: tuple[int, int], units: int) -> str:
    first, end = stage
    if end == units:
        return "whole" if first == 0 else "head"
    return "embedding" if first == 0 else "interior"


def make_up(data: SettingData, parts: Split, units: int, boundaries: tuple[int, ...]) -> dict[str, Any]:
    """Per part (train, validation, test): stages per group and the mean number of Alpa layers."""
    out: dict[str, Any] = {}
    for name, indices in (("train", parts.train), ("validation", parts.validation), ("test", parts.test)):
        groups: dict[str, int] = {}
        for i in indices:
            g = group(data.ranges[i], units)
            groups[g] = groups.get(g, 0) + 1
        out[name] = {"stages": len(indices), "groups": groups,
                     "mean_layers": statistics.fmean(layers(data.ranges[i], boundaries) for i in indices)}
    return out


def layers(stage: tuple[int, int], boundaries: tuple[int, ...]) -> int:
    return boundaries.index(stage[1]) - boundaries.index(stage[0])


def errors_by(data: SettingData, test: list[int], predicted: list[float], units: int,
              boundaries: tuple[int, ...]) -> dict[str, Any]:
    """Test MRE overall, per group, per length bin (Alpa layers), and the ten worst stages."""
    rows = []
    for i, p in zip(test, predicted, strict=True):
        y = data.latencies_s[i]
        rows.append({"stage": list(data.ranges[i]), "group": group(data.ranges[i], units),
                     "layers": layers(data.ranges[i], boundaries), "measured_ms": 1e3 * y,
                     "predicted_ms": 1e3 * p, "error_pct": 100.0 * (p - y) / y})

    def summary(selected: list[dict[str, Any]]) -> dict[str, Any]:
        absolute = [abs(r["error_pct"]) for r in selected]
        return {"stages": len(selected), "mre": statistics.fmean(absolute) if absolute else None,
                "mean_signed_pct": statistics.fmean(r["error_pct"] for r in selected) if selected else None,
                "share_of_error_sum": sum(absolute) / max(1e-12, sum(abs(r["error_pct"]) for r in rows))}

    by_group = {g: summary([r for r in rows if r["group"] == g]) for g in sorted({r["group"] for r in rows})}
    bins = ((1, 3), (4, 8), (9, 15), (16, 23))
    by_length = {f"{lo}-{hi}": summary([r for r in rows if lo <= r["layers"] <= hi]) for lo, hi in bins}
    worst = sorted(rows, key=lambda r: -abs(r["error_pct"]))[:10]
    return {"all": summary(rows), "by_group": by_group, "by_layers": by_length, "worst": worst}


def additive_baseline(data: SettingData, parts: Split, units: int) -> dict[str, Any]:
    """A four-number white-box reference: latency = c + blocks x b + embedding x e + head x h, fitted to the
    training stages (least squares on relative error) and scored (MRE, eq. 5) on the test stages."""
    import numpy as np

    def row(stage: tuple[int, int]) -> list[float]:
        first, end = stage
        return [1.0, float(min(end, units - 1) - max(first, 1)), float(first == 0), float(end == units)]

    x_train = np.array([row(data.ranges[i]) for i in parts.train])
    y_train = np.array([data.latencies_s[i] for i in parts.train])
    coef, *_ = np.linalg.lstsq(x_train / y_train[:, None], np.ones(len(y_train)), rcond=None)
    predicted = np.array([row(data.ranges[i]) for i in parts.test]) @ coef
    measured = np.array([data.latencies_s[i] for i in parts.test])
    return {"coef_ms": {k: 1e3 * float(v) for k, v in zip(("const", "block", "embedding", "head"), coef,
                                                           strict=True)},
            "test_mre": float(100.0 * np.mean(np.abs(predicted - measured) / measured))}


def fit(data: SettingData, parts: Split, args: argparse.Namespace) -> tuple[Any, list[dict[str, float]]]:
    """fit_one's training on the split, with the test MRE traced after every epoch when asked."""
    train_dags = [data.dags[i] for i in parts.train]
    train_y = [data.latencies_s[i] for i in parts.train]
    test_dags = [data.dags[i] for i in parts.test]
    test_y = [data.latencies_s[i] for i in parts.test]
    shell = prepare(train_dags, train_y, args.kind, args.target)  # the same normalisation train() computes
    trace: list[dict[str, float]] = []

    def on_epoch(epoch: int, val_loss: float, model: Any) -> None:
        shell.model = model
        predicted = shell.predict_s(test_dags)
        mre = 100.0 * statistics.fmean(abs(p - y) / y for p, y in zip(predicted, test_y, strict=True))
        trace.append({"epoch": epoch, "validation_loss": val_loss, "test_mre": mre})

    predictor = train(args.kind, train_dags, train_y,
                      ([data.dags[i] for i in parts.validation], [data.latencies_s[i] for i in parts.validation]),
                      epochs=args.epochs, patience=args.patience, seed=args.seed, target=args.target,
                      batch_graphs=args.batch_size, on_epoch=on_epoch if args.trace else None)
    return predictor, trace


def trace_summary(trace: list[dict[str, float]]) -> dict[str, Any]:
    kept = min(trace, key=lambda r: r["validation_loss"])  # train() keeps the first lowest
    oracle = min(trace, key=lambda r: r["test_mre"])
    return {"kept_epoch": kept, "best_test_epoch_oracle": oracle, "last_epoch": trace[-1],
            "test_mre_every_25": [r for r in trace if r["epoch"] % 25 == 24 or r is trace[-1]]}


def main() -> None:
    parser = argparse.ArgumentParser(description="Where one PredTOP split's test error comes from.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--mesh", default="1x1")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--layers", default="alpa")
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", default="transformer", choices=("transformer", "gcn", "gat", "none"))
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--patience", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=0)
    parser.add_argument("--target", default="log")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    spec = load_model(args.model)
    if not isinstance(spec, TransformerSpec):
        raise SystemExit(f"model: {spec.name} is not a transformer")
    corpus = with_layers(Corpus(spec, args.micro_batch, args.seq_len, 1), args.layers)
    setting = parse_settings(args.mesh, "dp")[0]
    data = setting_data(StageDatabase(args.db), corpus, setting, dag_builder(corpus))
    parts = split(len(data.dags), args.fraction, args.seed)
    bounds = corpus.layer_boundaries
    out: dict[str, Any] = {"setting": data.label, "seed": args.seed, "kind": args.kind, "epochs": args.epochs,
                           "patience": args.patience, "batch_size": args.batch_size,
                           "make_up": make_up(data, parts, corpus.units, bounds),
                           "additive_baseline": additive_baseline(data, parts, corpus.units)}
    if args.kind != "none":
        started = time.perf_counter()
        predictor, trace = fit(data, parts, args)
        predicted = predictor.predict_s([data.dags[i] for i in parts.test])
        out.update(epochs_run=predictor.epochs_run, train_s=time.perf_counter() - started,
                   errors=errors_by(data, parts.test, predicted, corpus.units, bounds))
        if trace:
            out["trace"] = trace_summary(trace)
            out["trace_all"] = trace
    text = json.dumps(out, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("trace_all",)}, indent=1))


if __name__ == "__main__":
    main()
