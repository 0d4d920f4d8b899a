"""ParallelSpec: the plain strategy (degrees of each axis, ZeRO, recompute, micro-batching, schedule)."""

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from trainsim.specbase import Spec
from trainsim.strategy.precision import Precision

Recompute = Literal["none", "selective", "full"]
# The pipeline schedules, by name: the one list every other module imports (the compiler registers one step-order
# builder per name in compile/schedules.py; a test checks the two agree).
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
# The attention kernel the training stack runs. flash2: FlashAttention-2 class (FlashAttention 1/2, torch SDPA's
# flash and memory-efficient backends, triton flash). flash3: a Hopper-native fused kernel (FlashAttention-3, or
# cuDNN fused attention, which TransformerEngine - and so Megatron-Core, NeMo, Megatron-Bridge - selects on
# Hopper and later); on a device without such kernels it runs as flash2. math: unfused (two batched GEMMs and a
# softmax over the whole score matrix).
AttentionKernel = Literal["flash2", "flash3", "math"]
ATTENTION_KERNELS: tuple[AttentionKernel, ...] = get_args(AttentionKernel)
# How the Adam(W) step runs, which decides the memory it needs on top of the model states. fused: one kernel
# per group of tensors, no temporaries (Megatron-Core / apex / TransformerEngine FusedAdam, torch fused=True).
# foreach: torch.optim's default on GPUs; its multi-tensor ops materialise an fp32 temporary as large as all the
# (local shard of the) parameters. loop: torch.optim's default on CPUs, one tensor at a time; its temporary is
# as large as one parameter tensor.
OptimizerImpl = Literal["fused", "foreach", "loop"]
OPTIMIZER_IMPLS: tuple[OptimizerImpl, ...] = get_args(OptimizerImpl)
RECOMPUTES: tuple[Recompute, ...] = get_args(Recompute)
# Upper bounds (issue 12: every number in range before an engine sees it). A degree is at most the largest cluster
# (hardware.cluster.MAX_GPUS); 2**24 tokens is 16x the longest context in the model catalog; 2**40 sequences per
# step and 2**24 per micro-batch are far past any run and keep every count exact in a float.
MAX_DEGREE = 2**24
MAX_SEQ_LEN = 2**24
MAX_MICRO_BATCH = 2**24
MAX_GLOBAL_BATCH = 2**40


class ParallelSpec(Spec):
    """Degrees of the parallel axes and the training-loop settings that go with them.

    dp=0 means "infer from the number of GPUs". Ranks are ordered tp (fastest), cp, dp, pp (slowest), as
    Megatron-LM orders them; ep shares ranks with dp.
    """

    # The descriptions are the help texts of the strategy flags of predict, search and measure
    # (cli/strategy_options.py); "choice_help" describes each allowed value of a choice field.
    tp: int = Field(default=1, gt=0, le=MAX_DEGREE, description="tensor-parallel degree")
    pp: int = Field(default=1, gt=0, le=MAX_DEGREE, description="pipeline-parallel degree")
    dp: int = Field(default=0, ge=0, le=MAX_DEGREE,
                    description="data-parallel degree, 0 = inferred from the number of GPUs")
    cp: int = Field(default=1, gt=0, le=MAX_DEGREE, description="context-parallel degree")
    ep: int = Field(default=1, gt=0, le=MAX_DEGREE, description="expert-parallel degree")
    vpp: int = Field(default=1, gt=0, le=MAX_DEGREE, description="virtual stages per pipeline rank")
    sp: bool = Field(default=False, description="sequence parallelism")
    zero: int = Field(default=0, ge=0, le=3, description="ZeRO stage 0-3 (1 = distributed optimizer)")
    recompute: Recompute = Field(default="none", description="activation recomputation")
    micro_batch: int = Field(default=1, gt=0, le=MAX_MICRO_BATCH, description="sequences per micro-batch")
    global_batch: int = Field(default=0, ge=0, le=MAX_GLOBAL_BATCH,
                              description="sequences per optimizer step, 0 = dp x micro_batch (one micro-batch)")
    seq_len: int = Field(default=2048, gt=0, le=MAX_SEQ_LEN, description="tokens per sequence")
    precision: Precision = Field(default="bf16", description="numeric precision")
    schedule: Schedule = Field(default="1f1b", description="pipeline schedule")
    attention: AttentionKernel = Field(default="flash2", description="attention kernel", json_schema_extra={
        "choice_help": {"flash2": "FlashAttention-2, torch SDPA",
                        "flash3": "Hopper+: FlashAttention-3, cuDNN as TransformerEngine / Megatron-Core pick it",
                        "math": "unfused"}})
    optimizer_impl: OptimizerImpl = Field(default="fused", description="Adam step", json_schema_extra={
        "choice_help": {"fused": "Megatron, apex, TE, torch fused=True", "foreach": "torch's default on GPUs",
                        "loop": "torch's default on CPUs"}})
    # How the layers are split into pipeline stages (strategy/stages.py split_blocks; Megatron-Core's
    # TransformerConfig fields of the same meaning, megatron/core/transformer/transformer_config.py 0.16.1).
    first_stage_layers: int = Field(default=0, ge=0, description="transformer layers on the first pipeline stage, "
                                    "0 = even split (Megatron-Core num_layers_in_first_pipeline_stage)")
    last_stage_layers: int = Field(default=0, ge=0, description="transformer layers on the last pipeline stage, "
                                   "0 = even split (Megatron-Core num_layers_in_last_pipeline_stage)")
    embedding_in_split: bool = Field(default=False, description="count the embedding as a layer of the pipeline "
                                     "split (Megatron-Core account_for_embedding_in_pipeline_split)")
    loss_in_split: bool = Field(default=False, description="count the output layer and loss as a layer of the "
                                "pipeline split (Megatron-Core account_for_loss_in_pipeline_split)")
    stage_layers: tuple[int, ...] = Field(default=(), description="transformer layers per pipeline stage, "
                                          "comma-separated: pp entries (each dealt over the stage's vpp chunks) "
                                          "or pp x vpp (per virtual stage, chunk-major); empty = computed")

    @field_validator("stage_layers", mode="before")
    @classmethod
    def _stage_layers_list(cls, value: object) -> object:
        """A comma-separated string (a flag, a job file) or a list of integers."""
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",")] if value.strip() else []
            if not all(item.isdigit() for item in items):
                raise ValueError("must be comma-separated non-negative integers, e.g. 15,16,16,15")
            return tuple(int(item) for item in items)
        if isinstance(value, list | tuple) and any(isinstance(item, bool) or not isinstance(item, int) or item < 0
                                                 for item in value):
            raise ValueError("must be non-negative integers, e.g. [15, 16, 16, 15]")
        return value

    @model_validator(mode="after")
    def _check(self) -> "ParallelSpec":
        if self.sp and self.tp == 1:
            raise ValueError("sp=True needs tp > 1 (sequence parallelism splits along the tensor-parallel group)")
        if self.vpp > 1 and self.schedule != "interleaved-1f1b":
            raise ValueError(f"vpp={self.vpp} needs schedule='interleaved-1f1b' (got {self.schedule!r})")
        if self.schedule == "interleaved-1f1b" and self.pp == 1:
            raise ValueError("schedule='interleaved-1f1b' needs pp > 1")
        self._check_split()
        return self

    def _check_split(self) -> None:
        """The split settings that need no model (strategy/stages.py checks the rest against the layers)."""
        uneven = self.first_stage_layers or self.last_stage_layers
        counted = self.embedding_in_split or self.loss_in_split
        if (uneven or counted or self.stage_layers) and self.pp == 1:
            raise ValueError("first_stage_layers, last_stage_layers, embedding_in_split, loss_in_split and "
                             "stage_layers need pp > 1")
        if uneven and counted:
            raise ValueError("first_stage_layers / last_stage_layers cannot be combined with embedding_in_split / "
                             "loss_in_split (Megatron-Core refuses it too)")
        if self.stage_layers and (uneven or counted):
            raise ValueError("stage_layers lists every stage; leave out first_stage_layers, last_stage_layers, "
                             "embedding_in_split and loss_in_split")
        if self.stage_layers and len(self.stage_layers) not in (self.pp, self.pp * self.vpp):
            allowed = f"pp={self.pp}" + (f" or pp x vpp={self.pp * self.vpp}" if self.vpp > 1 else "")
            raise ValueError(f"stage_layers has {len(self.stage_layers)} entries; allowed: {allowed}")

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def num_gpus(self) -> int:
        return self.model_parallel_size * self.dp

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per data-parallel rank per step; 0 until make_job has resolved dp and global_batch."""
        if self.dp == 0 or self.global_batch == 0:
            return 0
        return self.global_batch // (self.dp * self.micro_batch)

    def describe(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}"]
        parts += [f"{name}={value}" for name, value in (("cp", self.cp), ("ep", self.ep), ("vpp", self.vpp))
                  if value > 1]
        if self.sp:
            parts.append("sp")
        parts += [f"zero={self.zero}", f"recompute={self.recompute}", f"mb={self.micro_batch}",
                  f"gb={self.global_batch}", self.schedule, self.precision]
        if self.attention != "flash2":
            parts.append(f"attention={self.attention}")
        if self.optimizer_impl != "fused":
            parts.append(f"optimizer={self.optimizer_impl}")
        parts += [f"{name}={value}" for name, value in (("first_stage_layers", self.first_stage_layers),
                                                         ("last_stage_layers", self.last_stage_layers)) if value]
        parts += [name for name in ("embedding_in_split", "loss_in_split") if getattr(self, name)]
        if self.stage_layers:
            parts.append("stage_layers=" + ",".join(str(n) for n in self.stage_layers))
        return " ".join(parts)
