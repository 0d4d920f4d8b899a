"""PredTOP's experiment (sec. VII-VIII) as library code: collect measured stage latencies of a model per setting
(mesh x intra plan) into the stage database, train one predictor per setting, and evaluate the three predictors'
MRE against the fraction of stages used for training (Tables V-VI, Figs. 8-9). `trainsim stages` and
scripts/stage_experiments.py are thin callers; the work items (a setting's missing stages, one model fit) go
through a Runner, so that they run in this process, in a local process pool or as Ray tasks (fanout.py).

Torch is imported by the functions that measure or train, not at import.
"""

import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from trainsim.errors import ConfigError
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import StageDatabase, model_key, normalise_phases
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageEstimate, StageSpec, num_units

KINDS = ("transformer", "gcn", "gat")
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
DAG_SOURCES = ("torch", "jax")
MAX_UNITS = 130  # 8,515 stages per setting: far more than any collection here would run
MAX_EPOCHS = 100_000
MAX_ITERATIONS = 10_000
MAX_BATCH = 4096
CHUNK = 8  # stages measured per call (one set of gloo ranks per call; the database commits after each)
MAX_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class Setting:
    """A mesh and the intra-stage plan the stages run with on it (the paper's Table III pairs)."""

    mesh: Mesh
    intra: IntraPlan

    @property
    def label(self) -> str:
        return f"{self.mesh.describe()}/{self.intra.describe()}"


@dataclass(frozen=True, slots=True)
class Corpus:
    """What is measured: a model's stages at one micro-batch shape and thread count."""

    model: TransformerSpec
    micro_batch: int
    seq_len: int
    threads: int = 1  # torch threads per rank; 0: the stages were timed on a GPU (scripts/gpu/stages_gpu.py)
    boundaries: tuple[int, ...] | None = None  # layer boundaries in units (alpa_layers); None: every unit

    @property
    def units(self) -> int:
        return num_units(self.model)

    @property
    def layer_boundaries(self) -> tuple[int, ...]:
        return self.boundaries if self.boundaries is not None else tuple(range(self.units + 1))

    @property
    def key(self) -> str:
        return model_key(self.model)

    def stages(self, setting: Setting) -> list[StageSpec]:
        """Every contiguous range of layers on the setting (PredTOP samples from these): of units by default (the
        search's stages), of Alpa's clustered layers where `boundaries` is set (with_layers)."""
        cuts = self.layer_boundaries
        return [StageSpec(cuts[i], cuts[j], setting.mesh, setting.intra)
                for i in range(len(cuts) - 1) for j in range(i + 1, len(cuts))]


LAYERINGS = ("units", "alpa")
ALPA_MIN_HEAVY_OPS = 3  # LAYER_HEAVY_OP_LOWER_BOUND, alpa/pipeline_parallel/layer_construction.py, alpa 0.2.3
ALPA_EPS = 0.5  # DEFAULT_EPS, the same file: a layer's FLOPs may reach (1 + eps) x the average
HEAVY_OPS = frozenset({"mm", "addmm", "bmm", "matmul", "dot_general", "_scaled_dot_product_flash_attention_for_cpu",
                       "_scaled_dot_product_attention_math", "_scaled_dot_product_efficient_attention",
                       "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention"})


def alpa_layers(unit_flops: Sequence[float], unit_heavy_ops: Sequence[int], *, min_heavy: int = ALPA_MIN_HEAVY_OPS,
                eps: float = ALPA_EPS) -> tuple[int, ...]:
    """Layer boundaries (in units) of Alpa's layer construction over the unit chain, the layers PredTOP's stages
    are made of (sec. IV-B1, sec. VI: stages of Alpa's layers). Alpa's rule (cluster_jaxpr_by_cost,
    alpa/pipeline_parallel/layer_construction.py, alpa 0.2.3): a layer holds at least `min_heavy` heavy ops
    (matrix products) unless its FLOPs already reach the bound (1 + eps) x the average layer's. Units are taken
    in order and a layer is closed once it meets the rule, with layer_num = the number of units for the average;
    a tail that does not meet it joins the layer before. So the embedding (a gather: no heavy op, no FLOPs) joins
    the first block, and a head whose vocabulary product exceeds the bound stands alone."""
    if len(unit_flops) != len(unit_heavy_ops) or not unit_flops:
        raise ValueError("unit_flops and unit_heavy_ops: one entry per unit, at least one")
    bound = (1.0 + eps) * sum(unit_flops) / len(unit_flops)
    cuts = [0]
    flops, heavy = 0.0, 0
    for unit, (f, h) in enumerate(zip(unit_flops, unit_heavy_ops, strict=True)):
        flops, heavy = flops + f, heavy + h
        if heavy >= min_heavy or flops >= bound:
            cuts.append(unit + 1)
            flops, heavy = 0.0, 0
    if cuts[-1] != len(unit_flops):
        if len(cuts) > 1:
            cuts[-1] = len(unit_flops)
        else:
            cuts.append(len(unit_flops))
    return tuple(cuts)


def with_layers(corpus: Corpus, layering: str) -> Corpus:
    """The corpus with its stages made of `layering`: units (every unit range) or alpa (alpa_layers over the units'
    traced FLOPs and matrix products, dag.unit_costs)."""
    if layering not in LAYERINGS:
        raise ConfigError("layers", layering, f"one of {', '.join(LAYERINGS)}")
    if layering == "units":
        return replace(corpus, boundaries=None)
    from trainsim.search.predtop.dag import DagBuilder, unit_costs

    flops, heavy = unit_costs(DagBuilder(corpus.model, corpus.micro_batch, corpus.seq_len), HEAVY_OPS)
    return replace(corpus, boundaries=alpa_layers(flops, heavy))


def parse_settings(meshes: str, plans: str) -> list[Setting]:
    """`1x1,1x2` and `dp | tp | all`: per mesh, dp over all its devices, tp over all, or every tp x dp."""
    if plans not in ("dp", "tp", "all"):
        raise ConfigError("plans", plans, "one of dp, tp, all")
    out: list[Setting] = []
    for text in meshes.split(",")[:64]:
        parts = text.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or not all(1 <= int(p) <= 1024 for p in parts):
            raise ConfigError("meshes", text, "comma-separated NODESxDEVICES such as 1x1,1x2 (1 to 1024 each)")
        mesh = Mesh(int(parts[0]), int(parts[1]))
        size = mesh.size
        if plans == "dp":
            intras = [IntraPlan(1, size)]
        elif plans == "tp":
            intras = [IntraPlan(size, 1)]
        else:
            intras = [IntraPlan(tp, size // tp) for tp in range(1, size + 1) if size % tp == 0]
        out.extend(Setting(mesh, intra) for intra in intras if Setting(mesh, intra) not in out)
    return out


def parse_fractions(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")[:32] if part.strip()]
    except ValueError:
        values = []
    if not values or not all(0.0 < v <= 0.8 + 1e-9 for v in values):
        raise ConfigError("fractions", text, "comma-separated training fractions in (0, 0.8], e.g. 0.1,0.3")
    return values


def check_corpus(corpus: Corpus) -> None:
    if corpus.units > MAX_UNITS:
        raise ConfigError("model", corpus.model.name, f"at most {MAX_UNITS - 2} layers for stage collection")
    if not 1 <= corpus.micro_batch <= 4096:
        raise ConfigError("micro_batch", corpus.micro_batch, "must be 1 to 4096")
    if not 1 <= corpus.seq_len <= corpus.model.max_seq_len:
        raise ConfigError("seq_len", corpus.seq_len, f"must be 1 to the model's {corpus.model.max_seq_len}")
    if not 0 <= corpus.threads <= 4096:
        raise ConfigError("threads", corpus.threads, "must be 0 (stages timed on a GPU) to 4096")


# ---- work items and where they run -----------------------------------------------------------------------------------


class Runner(Protocol):
    """Runs fn over argument tuples, yielding (index, result) as each finishes. cpus: what each item occupies
    (a stage measurement: its mesh's ranks), for runners that place items on a cluster."""

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]],
            cpus: Sequence[float] | None = None) -> Iterator[tuple[int, Any]]: ...


class LocalRunner:
    """In this process, one item after the other."""

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]],
            cpus: Sequence[float] | None = None) -> Iterator[tuple[int, Any]]:
        for index, args in enumerate(items):
            yield index, fn(*args)


@dataclass(slots=True)
class PoolRunner:
    """A local process pool (spawned processes: torch and forked threads do not mix)."""

    workers: int

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]],
            cpus: Sequence[float] | None = None) -> Iterator[tuple[int, Any]]:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(fn, *args): index for index, args in enumerate(items)}
            for future in as_completed(futures):
                yield futures[future], future.result()


# ---- collection ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measured:
    stage: StageSpec
    estimate: StageEstimate
    samples_s: tuple[float, ...]
    reference_s: tuple[float, ...] = ()  # the reference probe's time around each run (measure.phase), if probed


def measure_chunk(corpus: Corpus, stages: list[StageSpec], warmup: int, iterations: int,
                  probe: bool = False) -> list[Measured]:
    """Measure stages of one mesh size for real (measure.stage); a Ray task or a local call."""
    from trainsim.measure.stage import measure_stages

    timings = measure_stages(corpus.model, stages, corpus.micro_batch, corpus.seq_len, warmup, iterations,
                             threads=corpus.threads, probe=probe)
    return [Measured(stage, StageEstimate(t.latency_s, t.state_bytes, t.activation_bytes), tuple(t.samples_s),
                     tuple(t.reference_s)) for stage, t in zip(stages, timings, strict=True)]


def missing(db: StageDatabase, corpus: Corpus, stages: Iterable[StageSpec]) -> list[StageSpec]:
    return [s for s in stages if db.get(corpus.key, corpus.micro_batch, corpus.seq_len, corpus.threads, s) is None]


@dataclass(slots=True)
class CollectReport:
    settings: dict[str, dict[str, float]] = field(default_factory=dict)  # label -> stages, measured_now, seconds
    fast_reference_s: float | None = None  # with phase_normalise: the probe's fast-phase time

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"settings": self.settings}
        if self.fast_reference_s is not None:
            out["fast_reference_s"] = self.fast_reference_s
        return out


def collect(db: StageDatabase, corpus: Corpus, settings: list[Setting], *, warmup: int = 2, iterations: int = 6,
            runner: Runner | None = None, progress: Callable[[str, int, int], None] | None = None,
            chunk: int = CHUNK, phase_normalise: bool = False) -> CollectReport:
    """Measure every stage of every setting that the database lacks (resumable: each chunk is committed as it
    arrives, and a rerun measures only what is missing). progress(label, done, total) after each chunk.
    phase_normalise: time measure.phase's reference probe around every run, keep the raw median and the probe's
    timings in the stage_phase table and make latency_s the phase-normalised latency (stage_db.normalise_phases,
    over every probed stage of the model and shape, once all chunks are in)."""
    check_corpus(corpus)
    if corpus.threads == 0:
        raise ConfigError("threads", 0, "1 or more: collection times stages on this machine's CPU ranks (0 marks "
                          "stages timed on a GPU by scripts/gpu/stages_gpu.py)")
    if not 0 <= warmup <= MAX_ITERATIONS or not 1 <= iterations <= MAX_ITERATIONS:
        raise ConfigError("iterations", iterations, f"warmup 0 to {MAX_ITERATIONS}, iterations 1 to {MAX_ITERATIONS}")
    runner = runner or LocalRunner()
    report = CollectReport()
    items: list[tuple[Any, ...]] = []
    owner: list[str] = []
    todo: dict[str, int] = {}
    for setting in settings:
        stages = corpus.stages(setting)
        if setting.intra.tp > 1 or corpus.micro_batch % setting.intra.dp:
            raise ConfigError("plans", setting.label, "stage collection runs dp intra plans whose dp divides the "
                              "micro-batch (tp stages time the wall clock, which drifts with the load here)")
        absent = missing(db, corpus, stages)
        report.settings[setting.label] = {"stages": len(stages), "measured_now": 0, "seconds": 0.0}
        todo[setting.label] = len(absent)
        for start in range(0, len(absent), chunk):
            items.append((corpus, absent[start:start + chunk], warmup, iterations, phase_normalise))
            owner.append(setting.label)
    done: dict[str, int] = dict.fromkeys(todo, 0)
    started = time.perf_counter()
    cpus = [float(item[1][0].mesh.size) for item in items]
    for index, results in runner.map(measure_chunk, items, cpus):
        label = owner[index]
        for m in results:
            db.put(corpus.key, corpus.micro_batch, corpus.seq_len, corpus.threads, m.stage, m.estimate, m.samples_s)
            if phase_normalise:
                db.put_phase(corpus.key, corpus.micro_batch, corpus.seq_len, corpus.threads, m.stage,
                             m.estimate.latency_s, m.reference_s)
        done[label] += len(results)
        row = report.settings[label]
        row["measured_now"] = done[label]
        row["seconds"] = time.perf_counter() - started  # when its last chunk arrived
        if progress is not None:
            progress(label, done[label], todo[label])
    if phase_normalise:
        report.fast_reference_s = normalise_phases(db, corpus.key, corpus.micro_batch, corpus.seq_len,
                                                   corpus.threads)
    return report


def table(db: StageDatabase, corpus: Corpus, setting: Setting) -> dict[tuple[int, int], float]:
    """The measured latency of every collected stage of a setting."""
    out = {}
    for stage in corpus.stages(setting):
        found = db.get(corpus.key, corpus.micro_batch, corpus.seq_len, corpus.threads, stage)
        if found is not None:
            out[(stage.first, stage.end)] = found.latency_s
    return out


# ---- DAGs, training, evaluation --------------------------------------------------------------------------------------


def dag_builder(corpus: Corpus, source: str = "torch") -> Any:
    """The stage-DAG builder: aten ops recorded from the torch stage (dag.py) or the stage's jaxpr (jaxdag.py)."""
    if source == "torch":
        from trainsim.search.predtop.dag import DagBuilder

        return DagBuilder(corpus.model, corpus.micro_batch, corpus.seq_len)
    if source == "jax":
        from trainsim.search.predtop.jaxdag import JaxDagBuilder

        return JaxDagBuilder(corpus.model, corpus.micro_batch, corpus.seq_len)
    raise ConfigError("dag_source", source, f"one of {', '.join(DAG_SOURCES)}")


@dataclass(frozen=True, slots=True)
class TrainOptions:
    epochs: int = 500  # sec. IV-B6
    patience: int = 200  # sec. IV-B8
    target: str = "log"
    device: str = "cpu"  # where the models train (cuda on a GPU machine)
    batch_size: int = 0  # graphs per optimizer step (sec. IV-B6: 32); 0: train.batch_size's rule

    def check(self) -> None:
        if not 1 <= self.epochs <= MAX_EPOCHS:
            raise ConfigError("epochs", self.epochs, f"must be 1 to {MAX_EPOCHS}")
        if not 1 <= self.patience <= MAX_EPOCHS:
            raise ConfigError("patience", self.patience, f"must be 1 to {MAX_EPOCHS}")
        if not 0 <= self.batch_size <= MAX_BATCH:
            raise ConfigError("batch_size", self.batch_size, f"must be 0 (32, fewer for small sets) to {MAX_BATCH}")
        from trainsim.search.predtop.train import TARGETS

        if self.target not in TARGETS:
            raise ConfigError("target", self.target, f"one of {', '.join(TARGETS)}")


def fit_one(kind: str, dags: list[Any], latencies_s: list[float], fraction: float, seed: int,
            options: TrainOptions) -> dict[str, Any]:
    """One model on one split (sec. VIII-A): trained on `fraction`, early-stopped on a separate 10%, scored (MRE,
    eq. 5) on the rest. A work item: plain data in and out."""
    from trainsim.search.predtop.train import mre_percent, split, train

    parts = split(len(dags), fraction, seed)
    predictor = train(kind, [dags[i] for i in parts.train], [latencies_s[i] for i in parts.train],
                      ([dags[i] for i in parts.validation], [latencies_s[i] for i in parts.validation]),
                      epochs=options.epochs, patience=options.patience, seed=seed, target=options.target,
                      device=options.device, batch_graphs=options.batch_size)
    predicted = predictor.predict_s([dags[i] for i in parts.test])
    return {"kind": kind, "fraction": fraction, "seed": seed, "train": len(parts.train),
            "validation": len(parts.validation), "test": len(parts.test),
            "mre": mre_percent(predicted, [latencies_s[i] for i in parts.test]),
            "epochs": predictor.epochs_run, "train_s": predictor.train_time_s}


def fit_predictor(kind: str, dags: list[Any], latencies_s: list[float], fraction: float, seed: int,
                  options: TrainOptions) -> Any:
    """The predictor of one setting for use: trained on `fraction` of its stages, the next 10% to stop on."""
    from trainsim.search.predtop.train import split, train

    parts = split(len(dags), fraction, seed)
    return train(kind, [dags[i] for i in parts.train], [latencies_s[i] for i in parts.train],
                 ([dags[i] for i in parts.validation], [latencies_s[i] for i in parts.validation]),
                 epochs=options.epochs, patience=options.patience, seed=seed, target=options.target,
                 device=options.device, batch_graphs=options.batch_size)


@dataclass(frozen=True, slots=True)
class SettingData:
    label: str
    ranges: list[tuple[int, int]]
    dags: list[Any]
    latencies_s: list[float]


def setting_data(db: StageDatabase, corpus: Corpus, setting: Setting, builder: Any) -> SettingData:
    found = table(db, corpus, setting)
    ranges = sorted(found)
    return SettingData(setting.label, ranges, [builder.stage(a, b) for a, b in ranges], [found[r] for r in ranges])


MIN_STAGES = 10  # a split needs a training, a validation and a test part


def run_key(label: str, result: dict[str, Any]) -> tuple[str, str, float, int]:
    """What identifies one fit within an evaluation of fixed options: setting, kind, fraction, seed."""
    return (label, str(result["kind"]), round(float(result["fraction"]), 6), int(result["seed"]))


def evaluate(data: list[SettingData], *, kinds: Sequence[str] = KINDS, fractions: Sequence[float] = FRACTIONS,
             seeds: Sequence[int] = (0,), options: TrainOptions = TrainOptions(), runner: Runner | None = None,
             progress: Callable[[int, int], None] | None = None,
             previous: dict[tuple[str, str, float, int], dict[str, Any]] | None = None,
             record: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """MRE per setting, fraction and kind (mean and spread over the seeds' splits), with the sample counts and
    training times: the paper's Tables V-VI and Figs. 8-9. Resumable: a fit found in `previous` (run_key ->
    result, from an earlier call with the same options) is not run again; record(label, result) is called as
    each new fit finishes."""
    options.check()
    for kind in kinds:
        if kind not in KINDS:
            raise ConfigError("kinds", kind, f"one of {', '.join(KINDS)}")
    items: list[tuple[Any, ...]] = []
    owner: list[str] = []
    out: dict[str, Any] = {}
    for d in data:
        if len(d.latencies_s) < MIN_STAGES:
            out[d.label] = {"samples": len(d.latencies_s), "note": f"fewer than {MIN_STAGES} stages collected"}
            continue
        out[d.label] = {"samples": len(d.latencies_s), "runs": []}
        for fraction in fractions:
            for kind in kinds:
                for seed in seeds:
                    found = (previous or {}).get(run_key(d.label, {"kind": kind, "fraction": fraction, "seed": seed}))
                    if found is not None:
                        out[d.label]["runs"].append(found)
                        continue
                    items.append((kind, d.dags, d.latencies_s, fraction, seed, options))
                    owner.append(d.label)
    for finished, (index, result) in enumerate((runner or LocalRunner()).map(fit_one, items), start=1):
        out[owner[index]]["runs"].append(result)
        if record is not None:
            record(owner[index], result)
        if progress is not None:
            progress(finished, len(items))
    for entry in out.values():
        if "runs" in entry:
            entry["table"] = summarise(entry["runs"])
    return out


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows per fraction: per kind the mean MRE over seeds, its standard deviation and the mean training time."""
    rows = []
    for fraction in sorted({r["fraction"] for r in runs}, reverse=True):
        row: dict[str, Any] = {"fraction": fraction}
        for kind in KINDS:
            mine = [r for r in runs if r["fraction"] == fraction and r["kind"] == kind]
            if not mine:
                continue
            mres = [r["mre"] for r in mine]
            row["train"], row["test"] = mine[0]["train"], mine[0]["test"]
            row[kind] = statistics.fmean(mres)
            row[kind + "_sd"] = statistics.pstdev(mres) if len(mres) > 1 else 0.0
            row[kind + "_train_s"] = statistics.fmean(r["train_s"] for r in mine)
        rows.append(row)
    return rows


def noise_floor(data: SettingData) -> float:
    """The MRE of an oracle that predicts each stage by the median of the other stages with the same DAG (the
    same features, edges and depths): what no DAG -> latency predictor can beat on these measurements."""
    groups: dict[bytes, list[float]] = {}
    for dag, y in zip(data.dags, data.latencies_s, strict=True):
        key = dag.features.tobytes() + repr(dag.edges).encode()
        groups.setdefault(key, []).append(y)
    errors = []
    for values in groups.values():
        for i, y in enumerate(values):
            rest = values[:i] + values[i + 1:]
            if rest:
                errors.append(abs(statistics.median(rest) - y) / y)
    return 100.0 * statistics.fmean(errors) if errors else math.nan


def sample_ranges(count: int, n: int, seed: int) -> list[int]:
    """Indices of `n` stages drawn at random (PredTOP's sampling, sec. IV-B1)."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return sorted(order[:n])


# ---- saved predictors ------------------------------------------------------------------------------------------------


FORMAT = "trainsim-predtop/1"


def save_predictors(path: Path, corpus: Corpus, predictors: dict[str, Any], meta: dict[str, Any]) -> None:
    """Per setting label, each kind's weights and normalisation, in one torch file."""
    import torch

    data = {"format": FORMAT, "model": corpus.key, "micro_batch": corpus.micro_batch, "seq_len": corpus.seq_len,
            "meta": meta, "predictors": {}}
    for label, by_kind in predictors.items():
        data["predictors"][label] = {
            kind: {"target": p.target, "center": p.center, "scale": p.scale,
                   "feature_mean": torch.from_numpy(p.feature_mean), "feature_std": torch.from_numpy(p.feature_std),
                   "state": p.model.state_dict(), "epochs_run": p.epochs_run, "train_time_s": p.train_time_s}
            for kind, p in by_kind.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)


def load_predictors(path: Path) -> dict[str, Any]:
    """The file save_predictors wrote: {label: {kind: Predictor}} plus its header."""
    import torch

    from trainsim.search.predtop.models import make_model
    from trainsim.search.predtop.train import Predictor

    try:
        data = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfigError("predictors", str(path), f"a file `trainsim stages train` wrote ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError("predictors", str(path), f"a {FORMAT} file from `trainsim stages train`")
    loaded: dict[str, Any] = {}
    for label, by_kind in data["predictors"].items():
        loaded[label] = {}
        for kind, p in by_kind.items():
            model = make_model(kind)
            model.load_state_dict(p["state"])
            loaded[label][kind] = Predictor(kind, model, p["target"], p["center"], p["scale"],
                                            p["feature_mean"].numpy(), p["feature_std"].numpy(), p["epochs_run"],
                                            p["train_time_s"])
    return {"header": {k: v for k, v in data.items() if k != "predictors"}, "predictors": loaded}
