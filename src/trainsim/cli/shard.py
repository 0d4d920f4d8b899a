"""`trainsim shard`: plan a DLRM's embedding tables with each sharder of Lin et al. Table III, predict each plan's
iteration time, and pick the fastest (Sec. V-A).

parse (flags -> DLRM, cluster, cost models) -> compute (search.sharding.compare_sharders) -> render (rich table
or one JSON object).
"""

import json
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console

from trainsim.api.results import Prediction
from trainsim.catalog import load_cluster, load_model
from trainsim.cli.errors import handles_errors
from trainsim.cost.embedding_lookup import MlpLookup, RooflineLookup
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import NO_HOST_COST, DenseHostCost
from trainsim.embedding.lookup_model import LookupCostModel
from trainsim.embedding.plan_file import read_plan
from trainsim.embedding.sharders import MEMORY_CAP_FRACTION, SHARDERS
from trainsim.embedding.sharders import shard as shard_tables
from trainsim.embedding.sharding import Optimizer, ShardingPlan
from trainsim.embedding.synthetic import TaskKind, generate_task
from trainsim.embedding.tables import tables_from_spec
from trainsim.errors import ConfigError
from trainsim.estimate.sharded_dlrm import SHARDED_ENGINES, estimate_sharded
from trainsim.frontends.catalog.sharded_dlrm import dlrm_model, sharded_job
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import DlrmSpec, EmbeddingTable
from trainsim.job import Job
from trainsim.jobfile import check_choice, job_from_settings, read_job_file
from trainsim.report.sharding import render_sharding, sharding_to_dict
from trainsim.search.sharding import compare_sharders

OPTIMIZERS = ("sgd", "rowwise-adagrad", "adagrad", "adam")


DENSE_HOST_HELP = ("DLRM: the dense part's host cost per op and per optimizer tensor, a JSON fitted from measured "
                   "traces (scripts/recsys_quiet.py fit-host; default: not priced)")


LOOKUP_IN_SITU_HELP = ("DLRM: the lookups' in-situ factors (forward, backward) on the --lookup model, a JSON fitted "
                       "from measured traces (scripts/recsys_quiet.py fit-lookup; default: none)")


def host_cost(path: Path | None) -> DenseHostCost:
    from trainsim.calibrate.dense_host import load_dense_host

    return NO_HOST_COST if path is None else load_dense_host(path)


def synthetic_model(kind: str, num_ranks: int, seed: int) -> DlrmSpec:
    check_choice("synthetic", kind, ("heavy", "normal"))
    tables = generate_task(cast(TaskKind, kind), num_ranks, seed)
    specs = tuple(EmbeddingTable(rows=t.rows, dim=t.dim, pooling_factor=t.pooling, zipf_alpha=t.zipf_alpha)
                  for t in tables)
    return dlrm_model(f"{kind}-task-r{num_ranks}-s{seed}", specs)


def lookup_model(name: str, cluster: ClusterSpec, seed: int, in_situ: Path | None = None) -> LookupCostModel:
    """The --lookup model, scaled by the in-situ factors of the `in_situ` file where given."""
    from trainsim.calibrate.lookup_in_situ import load_lookup_in_situ

    if name == "roofline":
        model: LookupCostModel = RooflineLookup(cluster.device)
    elif Path(name).exists():
        model = MlpLookup.load(Path(name), seed)
    else:
        raise ConfigError("lookup_model", name, "give roofline or the JSON file `trainsim profile embedding` fitted")
    return model if in_situ is None else load_lookup_in_situ(in_situ, model)


def _parse(model: str | None, synthetic: str | None, seed: int, num_ranks: int, cluster: str, local_batch: int,
           engine: str) -> tuple[DlrmSpec, ClusterSpec]:
    if num_ranks < 1 or local_batch < 1:
        raise ConfigError("num_ranks/local_batch", (num_ranks, local_batch), "must both be positive integers")
    check_choice("engine", engine, tuple(SHARDED_ENGINES.names()))
    if (model is None) == (synthetic is None):
        raise ConfigError("model", model, "give exactly one of --model (a DLRM) and --synthetic heavy|normal")
    if synthetic is not None:
        spec: object = synthetic_model(synthetic, num_ranks, seed)
    else:
        spec = load_model(cast(str, model))
    if not isinstance(spec, DlrmSpec):
        raise ConfigError("model", model, "trainsim shard takes a DLRM (kind: dlrm)")
    return spec, load_cluster(cluster)


@handles_errors
def shard(
    model: Annotated[str | None, typer.Option(help="a DLRM: catalog name or YAML file")] = None,
    synthetic: Annotated[str | None, typer.Option(help="a generated task instead: heavy or normal")] = None,
    seed: Annotated[int, typer.Option(help="seed of the generated task and of the random sharder")] = 0,
    num_ranks: Annotated[int, typer.Option(help="ranks (GPUs or local processes)")] = 4,
    cluster: Annotated[str, typer.Option(help="cluster preset or file (its device and links)")] = "local-cpu",
    local_batch: Annotated[int, typer.Option(help="samples per rank")] = 256,
    engine: Annotated[str, typer.Option(help="analytical or sim")] = "analytical",
    lookup: Annotated[str, typer.Option(help="embedding-lookup model: roofline or a fitted MLP JSON")] = "roofline",
    optimizer: Annotated[str, typer.Option(help="sgd, rowwise-adagrad, adagrad or adam")] = "sgd",
    cap_fraction: Annotated[float, typer.Option(help="tables per rank stay under this share of memory")] =
        MEMORY_CAP_FRACTION,
    dense_host: Annotated[Path | None, typer.Option(help=DENSE_HOST_HELP)] = None,
    lookup_in_situ: Annotated[Path | None, typer.Option(help=LOOKUP_IN_SITU_HELP)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
    plans: Annotated[bool, typer.Option(help="print each sharder's plan")] = True,
) -> None:
    """Plan the embedding tables with each sharder, predict each plan, pick the fastest."""
    spec, cluster_spec = _parse(model, synthetic, seed, num_ranks, cluster, local_batch, engine)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    opt = cast(Optimizer, optimizer)
    lookups = lookup_model(lookup, cluster_spec, seed, lookup_in_situ)
    report = compare_sharders(spec, cluster_spec, num_ranks, local_batch, engine=engine, lookups=lookups,
                              optimizer=opt, cap_fraction=cap_fraction, seed=seed, host=host_cost(dense_host))
    if json_out:
        print(json.dumps(sharding_to_dict(report), indent=2))
        return
    Console(width=160).print(render_sharding(report, plans))


def predict_sharded(job_file: Path | None, given: dict[str, Any], engine: str, sharder: str | None,
                    sharding: Path | None, lookup: str, seed: int = 0, dense_host: Path | None = None,
                    pricer: Pricer | None = None, lookup_in_situ: Path | None = None) -> Prediction:
    """`trainsim predict` of a DLRM with sharded tables: the job file's settings with the given flags (model,
    cluster, num_gpus, strategy) over them, as `trainsim predict` merges them; the ranks are the job's
    data-parallel ranks (its GPUs), the local batch its micro-batch; the plan from `sharder` (one of Table III's)
    or the `sharding` file (embedding.plan_file); pricer: the dense ops' and collectives' prices (`--costs`,
    `--db`, `--calibration`; default the calibrated roofline)."""
    check_choice("engine", engine, tuple(SHARDED_ENGINES.names()))
    job, plan = sharded_plan(job_file, given, sharder, sharding, seed)
    sjob = sharded_job(cast(DlrmSpec, job.model), plan, job.cluster, job.parallel.micro_batch,
                       precision=job.parallel.precision)
    result = estimate_sharded(sjob.job, sjob.graph, plan, engine, pricer,
                              lookups=lookup_model(lookup, job.cluster, seed, lookup_in_situ),
                              host=host_cost(dense_host))
    return Prediction.of(result, sjob.job)


def sharded_plan(job_file: Path | None, given: dict[str, Any], sharder: str | None, sharding: Path | None,
                 seed: int = 0) -> tuple[Job, ShardingPlan]:
    """The DLRM job of the job file with the given flags over it, and its tables' plan (from `sharder` or the
    `sharding` file): what `trainsim predict` and `trainsim measure` take with --sharder/--sharding."""
    if (sharder is None) == (sharding is None):
        raise ConfigError("sharder", sharder, "give one of --sharder NAME and --sharding FILE, not both")
    check_choice("sharder", sharder, SHARDERS)
    settings = read_job_file(job_file)
    settings.update({key: (str(value) if isinstance(value, Path) else value)
                     for key, value in given.items() if value is not None})
    job = job_from_settings(settings)
    if not isinstance(job.model, DlrmSpec):
        raise ConfigError("model", job.model.name, "--sharder/--sharding take a DLRM (kind: dlrm)")
    ranks = job.parallel.dp
    if ranks != job.num_gpus:
        raise ConfigError("dp", ranks, f"a sharded DLRM runs data-parallel on all {job.num_gpus} GPUs (no tp/pp)")
    tables = tables_from_spec(job.model.tables)
    per_node = min(job.cluster.gpus_per_node, ranks)
    if sharding is not None:
        plan = read_plan(sharding, tables, ranks, per_node)
    else:
        cap = MEMORY_CAP_FRACTION * job.cluster.device.hbm_bytes
        plan = shard_tables(tables, cast(str, sharder), ranks, cap_bytes=cap, ranks_per_node=per_node, seed=seed)
    return job, plan
