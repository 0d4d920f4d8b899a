"""`trainsim profile-embedding`: EmbeddingBag microbenchmarks on this machine (a CSV), and the fit of the
reuse-factor lookup model on them (a JSON of MLP weights) with its held-out MAPE against the roofline.

parse -> compute (profile.embedding, calibrate.lookup_model) -> render (a short table).
"""

import json
from pathlib import Path
from typing import Annotated

import typer

from trainsim.calibrate.lookup_model import fit_lookup_model, merge_passes, retest_mape
from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError
from trainsim.profile.embedding import CUDA_TIMINGS, SPACES, CsvRows, LookupBench, profile_lookups, read_csv
from trainsim.profile.ops import clock_for
from trainsim.report.output import write_text_atomic


@handles_errors
def profile_embedding(
    csv_path: Annotated[Path, typer.Option("--csv", help="microbenchmark rows: written, or read with --no-measure")],
    count: Annotated[int, typer.Option(help="microbenchmarks to take (half heavy, half normal)")] = 240,
    seed: Annotated[int, typer.Option(help="seed of the tables, batches and the split")] = 0,
    threads: Annotated[int, typer.Option(help="torch intra-op threads (1 = one rank's share)")] = 1,
    repeats: Annotated[int, typer.Option(help="timed repeats per benchmark (the fastest counts)")] = 7,
    measure: Annotated[bool, typer.Option("--measure/--no-measure", help="take the benchmarks")] = True,
    fit: Annotated[Path | None, typer.Option(help="fit the lookup model and write its JSON here")] = None,
    passes: Annotated[list[Path] | None, typer.Option("--pass-csv", help="with --fit: another pass over the same "
                                                      "benchmarks (same --count, --seed); each benchmark counts its "
                                                      "fastest time over the passes (repeatable)")] = None,
    extra: Annotated[list[Path] | None, typer.Option("--extra-csv", help="with --fit: another set of benchmarks "
                                                     "(another --seed) fitted and held out with these "
                                                     "(repeatable)")] = None,
    device: Annotated[str, typer.Option(help="where the benchmarks run: cpu, or cuda (torch's CUDA kernels)")]
    = "cpu",
    timing: Annotated[str, typer.Option(help="on a GPU: kernel (the kernels' own durations, from the CUDA "
                                        "profiler) or events (CUDA events around the host's launches too)")]
    = "kernel",
    cold: Annotated[bool, typer.Option("--cold/--warm", help="evict the caches before every timed pass (as inside "
                                       "a training step), or repeat the batch from warm caches")] = True,
) -> None:
    """Measure EmbeddingBag forward/backward times, then (with --fit) fit and score the lookup model."""
    if count < 1 or threads < 1 or repeats < 1:
        raise ConfigError("count/threads/repeats", (count, threads, repeats), "must all be positive integers")
    if device not in SPACES:
        raise ConfigError("device", device, f"one of {', '.join(SPACES)}")
    if timing not in CUDA_TIMINGS:
        raise ConfigError("timing", timing, f"one of {', '.join(CUDA_TIMINGS)}")
    if measure:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", device, "needs a CUDA GPU; this machine has none (use --device cpu)")
        torch.set_num_threads(threads)
        if device == "cpu":
            typer.echo(f"timing on the {clock_for('cpu')[1]}", err=True)
        with CsvRows(csv_path) as rows:

            def progress(bench: LookupBench) -> None:
                rows.add(bench)
                typer.echo(f"{bench.table.describe()} batch {bench.batch}: fwd {bench.fwd_s * 1e3:.3f} ms, bwd "
                           f"{bench.bwd_s * 1e3:.3f} ms", err=True)

            profile_lookups(count, seed, repeats=repeats, progress=progress, device=device, cold=cold,
                            cuda_timing=timing)
    benches = read_csv(csv_path)
    if fit is None:
        typer.echo(f"{len(benches)} microbenchmarks in {csv_path}")
        return
    runs = [benches, *(read_csv(path) for path in passes or [])]
    result = fit_lookup_model(merge_passes(runs) + [b for path in extra or [] for b in read_csv(path)], seed=seed)
    fit.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(fit, json.dumps(result.mlp.to_json()))
    typer.echo(f"lookup model: {result.train_rows} rows to fit, {result.test_rows} held out -> {fit}")
    floor = retest_mape(runs, seed=seed)
    if floor:
        typer.echo(f"pass-to-pass: the spread between the passes of {csv_path.name}'s held-out rows")
    typer.echo(f"{'phase':<5} {'tables':<7} {'MLP MAPE':>9} {'roofline MAPE':>14}"
               + (f" {'pass-to-pass':>13}" if floor else ""))
    for (phase, group), value in result.mlp_mape.items():
        spread = f" {floor[(phase, group)] * 100:12.2f}%" if floor else ""
        typer.echo(f"{phase:<5} {group:<7} {value * 100:8.2f}% {result.roofline_mape[(phase, group)] * 100:13.2f}%"
                   + spread)
    bw = ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in result.roofline_bw_bytes_per_s.items())
    typer.echo(f"roofline bandwidth fitted on the training rows: {bw}")


def register(app: typer.Typer) -> None:
    app.command("profile-embedding")(profile_embedding)
