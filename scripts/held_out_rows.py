"""Per-run errors of one source held out, and how much of each run's predicted time is attention.

Fits the run-level parameters on the runs (warm from --start, default the package fit, to the full tolerance),
refits without --source as the cross-validation's leave-one-source-out split does (calibrate.crossval: from the
fit on all runs, to WARM_TOLERANCE), then prints every held-out run: its device, hidden size, layers, sequence
length, GPUs, the held-out error, the error under the fit on all runs, and the attention share of its predicted
iteration time (-d log t / d log e over both attention efficiencies: the share of the time attention kernels
take on the critical path). Then the mean error per device generation and sequence length.

    python scripts/held_out_rows.py --runs some.csv --runs runs_multinode.csv --source mosaicml/llm-foundry \
        --fits /tmp/fits

--fits: a folder to keep the two fits in (full.yaml, split.yaml); rerunning with it reuses them.
"""

import argparse
import math
from collections import defaultdict
from pathlib import Path

from trainsim.calibrate.crossval import WARM_TOLERANCE
from trainsim.calibrate.fit import FULL_TOLERANCE, fit_micro, read_samples, write_calibration
from trainsim.calibrate.runs import FitSample, fit_runtime, log_errors
from trainsim.catalog.calibration import MEASUREMENTS_DIR, Calibration, load_calibration, read_calibration
from trainsim.ir.model_spec import TransformerSpec
from trainsim.pipeline import GraphCache

BUMP = 1.01  # the attention efficiencies' relative step for the share


def _fit(path: Path, base: Calibration, samples: list[FitSample], start: Calibration, tolerance: float
         ) -> Calibration:
    if path.is_file():
        return read_calibration(path)
    fitted = fit_runtime(base, samples, start=start, tolerance=tolerance)
    write_calibration(fitted, path, "scripts/held_out_rows.py")
    return fitted


def _attention_bumped(cal: Calibration) -> Calibration:
    compute = cal.compute.model_copy(update={
        "attention_efficiency": cal.compute.attention_efficiency * BUMP,
        "flash3_attention_efficiency": cal.compute.flash3_attention_efficiency * BUMP})
    return cal.model_copy(update={"compute": compute})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, action="append", required=True)
    parser.add_argument("--source", required=True, help="the source held out (runs.csv's source, first word)")
    parser.add_argument("--fits", type=Path, required=True, help="folder for the fits (reused when present)")
    parser.add_argument("--start", type=Path, help="the fit on all runs starts here (default: the package fit)")
    args = parser.parse_args()
    args.fits.mkdir(parents=True, exist_ok=True)
    samples = read_samples(args.runs)
    base = fit_micro(MEASUREMENTS_DIR)
    start = read_calibration(args.start) if args.start else load_calibration()
    full = _fit(args.fits / "full.yaml", base, samples, start, FULL_TOLERANCE)
    train = [s for s in samples if s.source != args.source]
    test = [s for s in samples if s.source == args.source]
    if not test:
        raise SystemExit(f"error: source={args.source!r} has no runs in {', '.join(map(str, args.runs))}")
    split = _fit(args.fits / "split.yaml", base, train, full, WARM_TOLERANCE)
    graphs = GraphCache()
    held, fitted = log_errors(split, test, graphs), log_errors(full, test, graphs)
    share = -(log_errors(_attention_bumped(split), test, graphs) - held) / math.log(BUMP)
    buckets: dict[tuple[str, int], list[float]] = defaultdict(list)
    print(f"{'run':24s} {'device':20s} {'hidden':>6s} {'layers':>6s} {'seq':>6s} {'gpus':>5s} "
          f"{'held out':>9s} {'all runs':>9s} {'attention':>9s}")
    for sample, error, error_all, attention in sorted(zip(test, held, fitted, share, strict=True),
                                                      key=lambda row: -abs(row[1])):
        job, model = sample.job, sample.job.model
        hidden, layers = (model.hidden, model.num_layers) if isinstance(model, TransformerSpec) else (0, 0)
        print(f"{sample.run_id[:24]:24s} {job.cluster.device.name:20s} {hidden:6d} "
              f"{layers:6d} {job.parallel.seq_len:6d} {job.num_gpus:5d} "
              f"{(math.exp(error) - 1) * 100:+8.1f}% {(math.exp(error_all) - 1) * 100:+8.1f}% {attention * 100:8.1f}%")
        generation = base.device_generation.get(job.cluster.device.name, job.cluster.device.name)
        buckets[(generation, job.parallel.seq_len)].append(math.exp(error) - 1)
    mape = sum(abs(math.exp(e) - 1) for e in held) / len(held) * 100
    print(f"\nheld out {args.source}: MAPE {mape:.2f}% over {len(test)} runs; mean signed error per generation and "
          "sequence length:")
    for (generation, seq), errors in sorted(buckets.items()):
        print(f"  {generation:10s} {seq:6d} {len(errors):4d} runs {sum(errors) / len(errors) * 100:+7.1f}%")


if __name__ == "__main__":
    main()
