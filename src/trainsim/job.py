"""A job: model + cluster + strategy, resolved (dp and global batch filled in) and checked for consistency."""

from dataclasses import dataclass, field

from trainsim.errors import ConfigError
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import ModelSpec, OpaqueSpec, TransformerSpec
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.stack import StackSpec
from trainsim.strategy.stages import is_even_split, virtual_stage_blocks


@dataclass(frozen=True, slots=True)
class Job:
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelSpec
    stack: StackSpec = field(default_factory=StackSpec)  # the training software (default: generic)

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def tokens_per_iteration(self) -> int:
        return self.parallel.global_batch * self.parallel.seq_len

    def describe(self) -> str:
        stack = f" stack={self.stack.name}" if self.stack.name != "generic" else ""
        return f"{self.model.name} on {self.cluster.name} ({self.num_gpus} GPUs): {self.parallel.describe()}{stack}"


def default_seq_len(model: ModelSpec) -> int:
    """The sequence length a job of `model` takes when none is given: the strategy's default, or the model's
    max_seq_len where its learned position table is shorter (GPT-2's 1,024)."""
    default = int(ParallelSpec.model_fields["seq_len"].default)
    if isinstance(model, TransformerSpec) and model.position == "learned":
        return min(default, model.max_seq_len)
    return default


def make_job(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelSpec, stack: StackSpec | None = None, *,
             num_gpus: int | None = None) -> Job:
    """Infer dp and the global batch where left out, then refuse every inconsistent combination. stack: the
    training software (default: generic). num_gpus: the GPUs the strategy fills (default: the cluster's; fewer
    where the job is one pipeline stage's view of a plan whose stages have their own device counts,
    compile/stage_meshes.py)."""
    par = _resolve_dp(parallel, cluster.num_gpus if num_gpus is None else num_gpus)
    if par.global_batch == 0:
        par = par.replaced(global_batch=par.dp * par.micro_batch)
    _check_batch(par)
    check_model_parallelism(model, par)
    return Job(model, cluster, par, stack or StackSpec())


def check_model_parallelism(model: ModelSpec, par: ParallelSpec) -> None:
    """The splits `model` allows (make_job's check; a front-end repeats it for a Job built without make_job):
    ConfigError naming the first field it does not allow."""
    if isinstance(model, TransformerSpec):
        _check_transformer(model, par)
    else:
        opaque = model if isinstance(model, OpaqueSpec) else None
        _check_non_transformer(model.kind, par, opaque is not None and opaque.split_by_tree,
                               opaque.no_tp_reason if opaque is not None else "")


def _resolve_dp(par: ParallelSpec, num_gpus: int) -> ParallelSpec:
    model_parallel = par.model_parallel_size
    if par.dp == 0:
        if num_gpus % model_parallel:
            raise ConfigError("tp*pp*cp", model_parallel,
                              f"must divide the number of GPUs ({num_gpus}); tp={par.tp} pp={par.pp} cp={par.cp}")
        return par.replaced(dp=num_gpus // model_parallel)
    if model_parallel * par.dp != num_gpus:
        raise ConfigError("tp*pp*dp*cp", model_parallel * par.dp,
                          f"must equal the number of GPUs ({num_gpus}); tp={par.tp} pp={par.pp} dp={par.dp} "
                          f"cp={par.cp}")
    return par


def _check_batch(par: ParallelSpec) -> None:
    per_step = par.dp * par.micro_batch
    if par.global_batch % per_step:
        raise ConfigError("global_batch", par.global_batch,
                          f"must be divisible by dp x micro_batch = {par.dp} x {par.micro_batch} = {per_step}")
    if par.schedule == "interleaved-1f1b" and par.num_micro_batches % par.pp:
        raise ConfigError("global_batch", par.global_batch,
                          f"interleaved-1f1b needs the number of micro-batches ({par.num_micro_batches}) "
                          f"to be a multiple of pp={par.pp}")


def _check_transformer(model: TransformerSpec, par: ParallelSpec) -> None:
    if model.num_heads % par.tp:
        raise ConfigError("tp", par.tp, f"must divide num_heads={model.num_heads} of {model.name}")
    if model.kv_heads % par.tp and par.tp % model.kv_heads:
        raise ConfigError("tp", par.tp, f"must divide or be a multiple of num_kv_heads={model.kv_heads}")
    if par.pp > model.num_layers:
        raise ConfigError("pp", par.pp, f"must be at most num_layers={model.num_layers} of {model.name}")
    virtual_stage_blocks(model.num_layers, par)  # refuses a split that leaves a stage empty or mis-sums
    if model.position == "learned" and par.seq_len > model.max_seq_len:
        raise ConfigError("seq_len", par.seq_len, f"must be at most max_seq_len={model.max_seq_len} of {model.name} "
                          "(learned position embeddings)")
    if par.seq_len % par.cp:
        raise ConfigError("cp", par.cp, f"must divide seq_len={par.seq_len}")
    if par.ep > 1 and not model.is_moe:
        raise ConfigError("ep", par.ep, f"must be 1 for the dense model {model.name}")
    if model.is_moe and model.num_experts % par.ep:
        raise ConfigError("ep", par.ep, f"must divide num_experts={model.num_experts}")
    if par.ep > 1 and (par.dp * par.cp) % par.ep:
        raise ConfigError("ep", par.ep, f"must divide dp x cp = {par.dp * par.cp} (experts share data ranks)")


def _check_non_transformer(kind: str, par: ParallelSpec, split_by_tree: bool = False, no_tp_reason: str = "") -> None:
    """split_by_tree: tp > 1 is priced through a strategy tree's configs over tp (a captured graph's ops; the
    compiler refuses it without one). no_tp_reason: otherwise, what the model's source lacks for tp (the refusal)."""
    if not is_even_split(par):
        raise ConfigError("stage_layers", par.stage_layers or "", f"the pipeline split settings apply to "
                          f"transformers; a model of kind {kind} has its layers dealt out in order")
    for axis, value in (("tp", par.tp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1 and not (axis == "tp" and split_by_tree):
            apply = "dp, pp, and tp through a strategy tree's splits" if split_by_tree else "only dp and pp"
            default = f"must be 1 for a model of kind {kind} ({apply} apply)"
            raise ConfigError(axis, value, no_tp_reason if axis == "tp" and no_tp_reason else default)
