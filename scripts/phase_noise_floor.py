"""The same-DAG noise floor (search.predtop.experiment.noise_floor) of a stage database collected with
`trainsim stages collect --phase-normalise`: raw medians (the stage_phase table) against the phase-normalised
latencies (stage_times), per setting; `--other DB` adds another database's floor for the same model and shape.

    python scripts/phase_noise_floor.py --model data/stages/models/gpt-deep.yaml \
        --db data/stages/cpu/stages_cpu_deep_phase.db --meshes 1x1 --layers alpa \
        --other data/stages/cpu/stages_cpu_deep.db

Reads the databases only (nothing is measured; --other is read from a copy).
"""

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from trainsim.catalog import load_model
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import StageDatabase
from trainsim.search.predtop.experiment import (
    Corpus,
    SettingData,
    dag_builder,
    noise_floor,
    parse_settings,
    setting_data,
    with_layers,
)


def raw_data(db: StageDatabase, corpus: Corpus, data: SettingData, setting_key: tuple[int, ...]) -> SettingData:
    """The same stages with their raw medians (stage_phase) in place of latency_s."""
    rows = {row.key: row.raw_latency_s for row in db.phase_rows(corpus.key, corpus.micro_batch, corpus.seq_len,
                                                                   corpus.threads)}
    raw = [rows[(a, b, *setting_key)] for a, b in data.ranges]
    return SettingData(data.label, data.ranges, data.dags, raw)


def main() -> None:
    parser = argparse.ArgumentParser(description="The same-DAG noise floor, raw and phase-normalised.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--other", type=Path)
    parser.add_argument("--meshes", default="1x1")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--layers", default="alpa")
    args = parser.parse_args()
    spec = load_model(args.model)
    if not isinstance(spec, TransformerSpec):
        raise SystemExit(f"model: {spec.name} is not a transformer")
    corpus = with_layers(Corpus(spec, args.micro_batch, args.seq_len, 1), args.layers)
    builder = dag_builder(corpus)
    for setting in parse_settings(args.meshes, "dp"):
        db = StageDatabase(args.db)
        data = setting_data(db, corpus, setting, builder)
        key = (setting.mesh.nodes, setting.mesh.devices_per_node, setting.intra.tp, setting.intra.dp,
               int(setting.intra.sp))
        raw = raw_data(db, corpus, data, key)
        ratio = [n / r for n, r in zip(data.latencies_s, raw.latencies_s, strict=True)]
        print(f"{setting.label}: {len(data.ranges)} stages; same-DAG noise floor raw {noise_floor(raw):.2f}% MRE, "
              f"phase-normalised {noise_floor(data):.2f}% (normalised / raw: median {statistics.median(ratio):.3f}, "
              f"{min(ratio):.3f}-{max(ratio):.3f})")
        db.close()
        if args.other is not None:
            with tempfile.TemporaryDirectory() as tmp:  # a copy: StageDatabase opens files for writing
                copy = Path(shutil.copy(args.other, Path(tmp) / args.other.name))
                other = StageDatabase(copy)
                print(f"  {args.other}: noise floor {noise_floor(setting_data(other, corpus, setting, builder)):.2f}%")
                other.close()


if __name__ == "__main__":
    main()
