"""The small Mixtral's router over tp run for real against its unsplit model and its priced collectives
(docs/strategy-tree.md, "Running the plans: `trainsim measure --tree`"; measure/moe_splits.py).

    python scripts/moe_router_tp_check.py [--out DIR]

On 2 gloo ranks, data/strategies/megatron/models/mixtral-small.yaml (4 layers of 256, 8 experts top-2, SwiGLU, 8
heads over 2 kv heads, rope) at micro-batch 4 x 128 tokens in fp32, for each tree (mixtral-small-tp2.yaml: the
router whole, mixtral-small-tp2-router-seq.yaml: by sequence; the experts Megatron's over the pair): one step up to
the optimizer against the unsplit model on the same batch (the loss to rel 1e-5, every gradient to rel 1e-4;
tests/unit/measure/tp_gradients.py), the same with the router's gradient summed twice (a mutation the comparison
must catch), and rank 0's collectives of the step (measure.collective_log) against the compiler's tp collectives
of the plan (measure.tp_degrees.priced_tp_collectives). Writes DIR/moe-router-tp.json and prints a table.
"""

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "unit" / "measure"), str(ROOT / "tests")]
from tp_gradients import Case, compare_gradients, step_collectives  # noqa: E402  # pyright: ignore[reportMissingImports]

MODEL = ROOT / "data" / "strategies" / "megatron" / "models" / "mixtral-small.yaml"
TREES = {"router whole": "mixtral-small-tp2.yaml", "router by seq": "mixtral-small-tp2-router-seq.yaml"}
JOB = {"micro_batch": 4, "global_batch": 4, "seq_len": 128}


def priced(tree: Path) -> Counter[tuple[str, int]]:
    from trainsim.compile.shape_layers import shape_layers
    from trainsim.frontends.catalog.build import build_graph
    from trainsim.jobfile import job_from_settings
    from trainsim.measure.tp_degrees import priced_tp_collectives
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree_yaml import load_tree_yaml

    job = job_from_settings({"model": str(MODEL), "tp": 2, "num_gpus": 2, "precision": "fp32",
                             "cluster": "local-cpu", **JOB})
    plan = load_tree_yaml(tree, build_graph(job.model, DeviceSlice.of(job.parallel))).lower(job.parallel)
    return priced_tp_collectives(shape_layers(job, plan))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "moe_router_tp")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_yaml = MODEL.read_text()
    trees = {name: (ROOT / "data" / "strategies" / "megatron" / file) for name, file in TREES.items()}
    cases = {name: Case(model_yaml=model_yaml, tree_yaml=path.read_text(), settings=JOB)
             for name, path in trees.items()}
    cases["router by seq, its gradient summed twice"] = Case(model_yaml=model_yaml, settings=JOB,
                                                             tree_yaml=trees["router by seq"].read_text(),
                                                             sum_token_splits_twice=True)
    shutil.rmtree(args.out / "ranks", ignore_errors=True)  # the ranks write fresh folders
    failures = compare_gradients(cases, args.out / "ranks")
    report = {}
    for name in cases:
        measured = Counter(step_collectives(args.out / "ranks", cases, name))
        tree = trees["router by seq" if name.startswith("router by seq") else name]
        expected = priced(tree)
        report[name] = {"failure": failures[name], "measured": sorted(measured.items()),
                        "priced": sorted(expected.items()),
                        "measured less priced": sorted((measured - expected).items()),
                        "priced less measured": sorted((expected - measured).items())}
    (args.out / "moe-router-tp.json").write_text(json.dumps(report, indent=1, default=str))
    for name, row in report.items():
        print(f"{name}: {'gradients and loss match' if not row['failure'] else row['failure'][:300]}")
        print(f"  collectives measured less priced {row['measured less priced']}, priced less measured "
              f"{row['priced less measured']}")


if __name__ == "__main__":
    main()
