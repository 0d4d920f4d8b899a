"""Named FLOP conventions of published MFU and TFLOP/s figures, and the conversion of a prediction to them.

trainsim has one MFU (Result.mfu, MFU_FORMULA): the model FLOPs of the op graph / (iteration time x GPUs x dense
peak). A source that counts model FLOPs its own way reports MFU = its FLOP count / (the same time x GPUs x peak),
so validate converts a prediction by the ratio of the two FLOP counts, under the convention the source is stated
to use (row_defaults.yaml, flops_convention_by_source: a data fact per source).
"""

from collections.abc import Callable
from dataclasses import replace

from trainsim.errors import TrainsimError
from trainsim.estimate.result import Result
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job
from trainsim.registry import Registry

# model, seq_len, parameter count -> model FLOPs per token (forward + backward, no recomputation)
FlopsPerToken = Callable[[TransformerSpec, int, float], float]
FLOPS_CONVENTIONS: Registry[FlopsPerToken] = Registry("flops convention")


@FLOPS_CONVENTIONS.register("6nd")
def six_nd(model: TransformerSpec, seq_len: int, params: float) -> float:
    """6 N per token: 2 FLOPs per multiply-add, forward + backward = 3 x forward, every weight once (Kaplan et
    al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1)."""
    return 6.0 * params


@FLOPS_CONVENTIONS.register("6nd+attention")
def six_nd_attention(model: TransformerSpec, seq_len: int, params: float) -> float:
    """6 N per token for the weights plus 12 L h s per token for the attention scores and values, without causal
    masking (PaLM, Chowdhery et al. 2022, app. B); llm-foundry's MFU counts the same."""
    return six_nd(model, seq_len, params) + 12.0 * model.num_layers * model.hidden * seq_len


def convention_flops(convention: str, job: Job, params: float) -> float:
    """Model FLOPs of one iteration of `job` counted under the named convention."""
    if not isinstance(job.model, TransformerSpec):
        raise TrainsimError(f"the {convention} FLOP convention counts transformers only, not {job.model.name}")
    per_token = FLOPS_CONVENTIONS.get(convention)(job.model, job.parallel.seq_len, params)
    return per_token * job.tokens_per_iteration


def in_convention(result: Result, job: Job, params: float, convention: str) -> Result:
    """The prediction's MFU and TFLOP/s per GPU with the model FLOPs counted under `convention` (time, GPUs and
    peak unchanged: Result.mfu's own definition, applied to the other FLOP count)."""
    flops = convention_flops(convention, job, params)
    scale = flops / result.model_flops_per_iteration
    return replace(result, model_flops_per_iteration=flops, mfu=result.mfu * scale,
                   tflops_per_gpu=result.tflops_per_gpu * scale)
