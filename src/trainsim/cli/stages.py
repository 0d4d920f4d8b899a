"""`trainsim stages collect | train | evaluate`: PredTOP's experiment (sec. VII-VIII) on this machine.

- collect: measure every stage (unit range) of a model per mesh and intra plan into the stage database
  (resumable, like `trainsim profile`: a rerun measures only what is missing);
- train: one predictor per setting (DAG Transformer, GCN or GAT) on a fraction of its collected stages, saved to
  a file;
- evaluate: MRE per setting against the training fraction (10% to 80%, a separate 10% for validation, the rest
  for testing), the paper's Tables V-VI.
Parse here, compute in trainsim.search.predtop.experiment; `--ray ADDRESS` runs the settings as Ray tasks.
"""

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainsim.catalog import load_model
from trainsim.cli.errors import handles_errors
from trainsim.errors import ConfigError, TrainsimError
from trainsim.ir.model_spec import TransformerSpec
from trainsim.search.predtop.experiment import (
    CHUNK,
    DAG_SOURCES,
    FRACTIONS,
    KINDS,
    LAYERINGS,
    MAX_CHUNK,
    Corpus,
    LocalRunner,
    PoolRunner,
    Runner,
    TrainOptions,
    check_corpus,
    parse_fractions,
    parse_settings,
    with_layers,
)

ModelOpt = Annotated[str, typer.Option(help="catalog name or model YAML (a transformer)")]
DbOpt = Annotated[Path, typer.Option(help="the stage database (SQLite; created if absent)")]
MeshesOpt = Annotated[str, typer.Option(help="submeshes NODESxDEVICES, comma-separated")]
PlansOpt = Annotated[str, typer.Option(help="intra plans per mesh: dp | tp | all")]
MicroOpt = Annotated[int, typer.Option(help="sequences per micro-batch")]
SeqOpt = Annotated[int, typer.Option(help="tokens per sequence")]
RayOpt = Annotated[str | None, typer.Option("--ray", help="run the settings as Ray tasks on this cluster "
                                            "(ray://HOST:PORT, auto, or local); needs trainsim[ray]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
BatchOpt = Annotated[int, typer.Option(help="graphs per optimizer step (sec. IV-B6: 32); 0: 32, fewer where the "
                                       "training set is under 128 so that an epoch takes 4 steps")]
LayersOpt = Annotated[str, typer.Option(help="stages made of: units (every range of embedding, blocks, head) | "
                                        "alpa (Alpa's layer clustering, PredTOP's stages: the embedding joins the "
                                        "first block)")]


def _torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TrainsimError("trainsim stages needs PyTorch: pip install torch") from None


def _corpus(model: str, micro_batch: int, seq_len: int, threads: int, layers: str) -> Corpus:
    spec = load_model(model)
    if not isinstance(spec, TransformerSpec):
        raise ConfigError("model", spec.name, "stage planning needs a transformer (a chain of blocks)")
    if layers not in LAYERINGS:
        raise ConfigError("layers", layers, f"one of {', '.join(LAYERINGS)}")
    corpus = Corpus(spec, micro_batch, seq_len, threads)
    check_corpus(corpus)
    if layers != "units":
        _torch()
    return with_layers(corpus, layers)


def _db(path: Path) -> Any:
    from trainsim.measure.stage_db import StageDatabase

    if path.exists() and not path.is_file():
        raise ConfigError("db", str(path), "must be a database file (or a path where one can be created)")
    return StageDatabase(path)


def _runner(ray: str | None, workers: int) -> Runner:
    if ray is not None:
        from trainsim.search.predtop.fanout import RayRunner

        return RayRunner.connect(ray)
    if not 1 <= workers <= 256:
        raise ConfigError("workers", workers, "must be 1 to 256")
    return PoolRunner(workers) if workers > 1 else LocalRunner()


def _bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


@handles_errors
def collect(
    model: ModelOpt, db: DbOpt, meshes: MeshesOpt = "1x1", plans: PlansOpt = "dp", micro_batch: MicroOpt = 4,
    seq_len: SeqOpt = 64,
    warmup: Annotated[int, typer.Option(help="untimed runs of each stage")] = 2,
    iterations: Annotated[int, typer.Option(help="timed runs of each stage (median)")] = 6,
    threads: Annotated[int, typer.Option(help="torch threads per rank")] = 1,
    chunk: Annotated[int, typer.Option(help="stages per measuring call: one set of gloo ranks started per call, "
                                       "the database committed after each")] = CHUNK,
    layers: LayersOpt = "units", ray: RayOpt = None, as_json: JsonOpt = False,
    phase_normalise: Annotated[bool, typer.Option(
        "--phase-normalise", help="time a fixed reference workload around every run and store each stage's "
        "latency as it would be in the machine's fast phase (raw medians kept in the stage_phase table)")] = False,
) -> None:
    """Measure every stage of MODEL on each setting into the stage database (only what it lacks)."""
    from trainsim.search.predtop.experiment import collect as run_collect

    if not 1 <= chunk <= MAX_CHUNK:
        raise ConfigError("chunk", chunk, f"must be 1 to {MAX_CHUNK} stages per call")
    corpus = _corpus(model, micro_batch, seq_len, threads, layers)
    settings = parse_settings(meshes, plans)
    runner = _runner(ray, 1)
    _torch()
    database = _db(db)
    started = time.perf_counter()
    with _bar(Console(stderr=True)) as bar:
        tasks: dict[str, Any] = {}

        def progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done)

        report = run_collect(database, corpus, settings, warmup=warmup, iterations=iterations, runner=runner,
                             progress=progress, chunk=chunk, phase_normalise=phase_normalise)
    out = {"db": str(db), "model": corpus.key, **report.to_dict(), "seconds": time.perf_counter() - started}
    database.close()
    if as_json:
        typer.echo(json.dumps(out, indent=1))
        return
    for label, row in report.settings.items():
        typer.echo(f"{label}: {int(row['stages'])} stages, {int(row['measured_now'])} measured now "
                   f"({row['seconds']:.1f} s), the rest already in {db}")


def _kinds(text: str) -> list[str]:
    kinds: list[str] = [*KINDS] if text == "all" else [k.strip() for k in text.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        raise ConfigError("kinds", text, f"all or comma-separated {', '.join(KINDS)}")
    return kinds


def _seeds(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")[:64] if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise ConfigError("seeds", text, "comma-separated non-negative integers such as 0,1,2")
    return [int(p) for p in parts]


def _data(db: Path, corpus: Corpus, settings: list[Any], source: str) -> list[Any]:
    from trainsim.search.predtop.experiment import dag_builder, setting_data

    if source not in DAG_SOURCES:
        raise ConfigError("dag_source", source, f"one of {', '.join(DAG_SOURCES)}")
    if not db.is_file():
        raise ConfigError("db", str(db), "no such database: run `trainsim stages collect` first")
    database = _db(db)
    builder = dag_builder(corpus, source)
    data = [setting_data(database, corpus, setting, builder) for setting in settings]
    database.close()
    return data


@handles_errors
def train(
    model: ModelOpt, db: DbOpt,
    out: Annotated[Path, typer.Option(help="where to save the predictors (a torch file)")],
    meshes: MeshesOpt = "1x1", plans: PlansOpt = "dp", micro_batch: MicroOpt = 4, seq_len: SeqOpt = 64,
    threads: Annotated[int, typer.Option(help="torch threads per rank of the stages (0: timed on a GPU)")] = 1,
    kinds: Annotated[str, typer.Option(help="all or comma-separated transformer,gcn,gat")] = "transformer",
    fraction: Annotated[float, typer.Option(help="fraction of a setting's stages to train on")] = 0.3,
    epochs: Annotated[int, typer.Option(help="epochs (sec. IV-B6: 500)")] = 500,
    patience: Annotated[int, typer.Option(help="early-stopping patience (sec. IV-B8: 200)")] = 200,
    seed: Annotated[int, typer.Option(help="split and initialisation seed")] = 0,
    dag_source: Annotated[str, typer.Option(help="stage DAGs from: torch | jax")] = "torch",
    target: Annotated[str, typer.Option(help="loss target: log | relative | absolute (the paper's MAE)")] = "log",
    batch_size: BatchOpt = 0, layers: LayersOpt = "units", ray: RayOpt = None, as_json: JsonOpt = False,
) -> None:
    """Train one predictor per setting on its collected stages and save them."""
    from trainsim.search.predtop.experiment import MIN_STAGES, fit_predictor, save_predictors

    corpus = _corpus(model, micro_batch, seq_len, threads, layers)
    settings = parse_settings(meshes, plans)
    chosen = _kinds(kinds)
    parse_fractions(str(fraction))
    options = TrainOptions(epochs, patience, target, batch_size=batch_size)
    options.check()
    if seed < 0:
        raise ConfigError("seed", seed, "must be a non-negative integer")
    runner = _runner(ray, 1)
    _torch()
    data = [d for d in _data(db, corpus, settings, dag_source)]
    short = [d.label for d in data if len(d.latencies_s) < MIN_STAGES]
    if short:
        raise ConfigError("db", str(db), f"{short[0]} has fewer than {MIN_STAGES} stages collected: run "
                          "`trainsim stages collect` with the same model, shape and meshes first")
    items = [(kind, d.dags, d.latencies_s, fraction, seed, options) for d in data for kind in chosen]
    owners = [(d.label, kind) for d in data for kind in chosen]
    predictors: dict[str, dict[str, Any]] = {d.label: {} for d in data}
    started = time.perf_counter()
    with _bar(Console(stderr=True)) as bar:
        task = bar.add_task("training", total=len(items))
        for index, predictor in runner.map(fit_predictor, items):
            label, kind = owners[index]
            predictors[label][kind] = predictor
            bar.update(task, advance=1)
    save_predictors(out, corpus, predictors, {"fraction": fraction, "seed": seed, "epochs": epochs,
                                              "patience": patience, "dag_source": dag_source, "target": target,
                                              "layers": layers, "batch_size": batch_size})
    summary = {"out": str(out), "seconds": time.perf_counter() - started,
               "settings": {label: {kind: {"epochs_run": p.epochs_run, "train_s": p.train_time_s,
                                           "validation_loss": p.best_validation_loss}
                                    for kind, p in by_kind.items()} for label, by_kind in predictors.items()}}
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
        return
    for label, by_kind in summary["settings"].items():
        for kind, row in by_kind.items():
            typer.echo(f"{label} {kind}: {row['epochs_run']} epochs, {row['train_s']:.1f} s")
    typer.echo(f"saved to {out}")


@handles_errors
def evaluate(
    model: ModelOpt, db: DbOpt, meshes: MeshesOpt = "1x1", plans: PlansOpt = "dp", micro_batch: MicroOpt = 4,
    seq_len: SeqOpt = 64,
    threads: Annotated[int, typer.Option(help="torch threads per rank of the stages (0: timed on a GPU)")] = 1,
    kinds: Annotated[str, typer.Option(help="all or comma-separated transformer,gcn,gat")] = "all",
    fractions: Annotated[str, typer.Option(help="training fractions")] = ",".join(str(f) for f in FRACTIONS),
    seeds: Annotated[str, typer.Option(help="splits to average over")] = "0,1,2",
    epochs: Annotated[int, typer.Option(help="epochs (sec. IV-B6: 500)")] = 500,
    patience: Annotated[int, typer.Option(help="early-stopping patience (sec. IV-B8: 200)")] = 200,
    dag_source: Annotated[str, typer.Option(help="stage DAGs from: torch | jax")] = "torch",
    workers: Annotated[int, typer.Option(help="local processes training at once")] = 1,
    target: Annotated[str, typer.Option(help="loss target: log | relative | absolute (the paper's MAE)")] = "log",
    batch_size: BatchOpt = 0,
    layers: LayersOpt = "units",
    runs: Annotated[Path | None, typer.Option(help="JSON-lines file of the fits: each appended as it finishes, "
                                              "and fits already there (same options) not run again")] = None,
    ray: RayOpt = None, as_json: JsonOpt = False,
) -> None:
    """MRE of the DAG Transformer, GCN and GAT per setting against the fraction of stages trained on."""
    from trainsim.search.predtop.experiment import evaluate as run_evaluate
    from trainsim.search.predtop.experiment import noise_floor

    corpus = _corpus(model, micro_batch, seq_len, threads, layers)
    settings = parse_settings(meshes, plans)
    chosen, chosen_fractions, chosen_seeds = _kinds(kinds), parse_fractions(fractions), _seeds(seeds)
    options = TrainOptions(epochs, patience, target, batch_size=batch_size)
    options.check()
    runner = _runner(ray, workers)
    _torch()
    identity = {"model": corpus.key, "micro_batch": corpus.micro_batch, "seq_len": corpus.seq_len,
                "threads": corpus.threads, "layers": layers, "dag_source": dag_source, "target": target,
                "max_epochs": epochs, "patience": patience}
    if batch_size:  # only where set, so that the runs files of the default rule still resume
        identity["batch_size"] = batch_size
    previous = _previous_runs(runs, identity)
    data = _data(db, corpus, settings, dag_source)
    started = time.perf_counter()

    def record(label: str, result: dict[str, Any]) -> None:
        if runs is not None:
            with runs.open("a") as sink:
                sink.write(json.dumps({**identity, "setting": label, **result}) + "\n")

    with _bar(Console(stderr=True)) as bar:
        task = bar.add_task("training", total=None)
        result = run_evaluate(data, kinds=chosen, fractions=chosen_fractions, seeds=chosen_seeds, options=options,
                              runner=runner, progress=lambda done, total: bar.update(task, completed=done,
                                                                                     total=total),
                              previous=previous, record=record)
    for d in data:
        if "runs" in result[d.label]:
            result[d.label]["noise_floor_mre"] = noise_floor(d)
    summary = {"model": corpus.key, "layers": layers, "boundaries": list(corpus.layer_boundaries),
               "dag_source": dag_source, "target": target, "seeds": chosen_seeds, "epochs": epochs,
               "patience": patience, "seconds": time.perf_counter() - started, "settings": result}
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
        return
    typer.echo(render_table(summary, chosen))


def _previous_runs(path: Path | None, identity: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """The fits of an earlier `evaluate --runs PATH` with the same model, shape, layers and training options."""
    from trainsim.search.predtop.experiment import run_key

    if path is None or not path.exists():
        return {}
    if not path.is_file():
        raise ConfigError("runs", str(path), "must be a JSON-lines file (or a path where one can be created)")
    found: dict[Any, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if all(row.get(k) == v for k, v in identity.items()):
                result = {k: v for k, v in row.items() if k not in identity and k != "setting"}
                found[run_key(str(row["setting"]), result)] = result
        except (ValueError, KeyError, TypeError):
            raise ConfigError("runs", f"{path}:{number}", "a line `trainsim stages evaluate --runs` wrote") from None
    return found


def render_table(summary: dict[str, Any], kinds: list[str]) -> str:
    lines = []
    for label, entry in summary["settings"].items():
        if "table" not in entry:
            lines.append(f"{label}: {entry.get('note', 'not evaluated')} ({entry['samples']} stages)")
            continue
        lines.append(f"{label}: {entry['samples']} stages; noise floor {entry['noise_floor_mre']:.2f}% MRE; "
                     f"MRE % (mean over seeds {summary['seeds']})")
        lines.append("  fraction  train  test  " + "  ".join(f"{k:>11}" for k in kinds))
        for row in entry["table"]:
            cells = "  ".join(f"{row[k]:6.2f}+-{row[k + '_sd']:4.1f}" if k in row else " " * 11 for k in kinds)
            lines.append(f"  {row['fraction']:8.0%}  {row['train']:5d}  {row['test']:4d}  {cells}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="PredTOP's stage latency predictors: collect, train, evaluate.",
                        no_args_is_help=True)
    group.command("collect")(collect)
    group.command("train")(train)
    group.command("evaluate")(evaluate)
    app.add_typer(group, name="stages")
