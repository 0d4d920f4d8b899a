"""Profile one job: measure every unique op of its OpGraph, and the per-layer framework overhead of DTensor or
FSDP2 where the job uses them, into the profile database."""

from collections.abc import Callable
from dataclasses import replace

from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import ModelSpec, TransformerSpec
from trainsim.profile.database import Environment, OpSignature, ProfileDB
from trainsim.profile.ops import KernelHints, OpProfileSummary, profile_graph
from trainsim.strategy.device_slice import DeviceSlice


def job_graph(model: ModelSpec, dev: DeviceSlice) -> OpGraph:
    """The per-device OpGraph of the job, from the catalog front-end (tp-sharded shapes when tp > 1)."""
    return build_graph(model, dev)


def hints_for(model: ModelSpec, dev: DeviceSlice) -> KernelHints:
    amp = dev.precision.linear_dtype if dev.precision.name.startswith("amp-") else ""
    if isinstance(model, TransformerSpec):
        return KernelHints(hidden=model.hidden, vocab=max(1, model.vocab // dev.tp), seq_len=dev.seq_len,
                           bias=model.bias, norm=model.norm, amp=amp)
    return KernelHints(seq_len=dev.seq_len, amp=amp)


def profile_job(db: ProfileDB, env: Environment, model: ModelSpec, dev: DeviceSlice, device: str, *,
                warmup: int = 3, repeats: int = 10, optimizer: bool = True,
                progress: Callable[[OpSignature, str], None] | None = None,
                plan: Callable[[int], None] | None = None) -> OpProfileSummary:
    """Measure the ops of `model` on the slice `dev` on `device` ("cpu" or "cuda") that `db` lacks for `env`; with
    tp > 1 or zero >= 2 also the per-layer overhead of DTensor or FSDP2 (framework.py)."""
    graph = job_graph(model, dev)
    summary = profile_graph(db, env, graph, hints_for(model, dev), device, warmup=warmup, repeats=repeats,
                            optimizer=optimizer, progress=progress, plan=plan)
    if not isinstance(model, TransformerSpec):
        return summary
    from trainsim.profile.framework import framework_signature, frameworks_for, measure_framework_overhead

    precision = dev.precision.name
    frameworks = frameworks_for(dev.tp, dev.sp, dev.zero)
    measured = stored = 0
    for framework in frameworks:
        sig = framework_signature(framework, precision)
        missing = repeats - db.op_repeats(env, sig)
        if missing > 0:
            samples, detail = measure_framework_overhead(model, dev.micro_batch, dev.seq_len, precision,
                                                         framework, device, warmup, missing)
            db.add_op_samples(env, sig, samples, detail)
        measured, stored = measured + (missing > 0), stored + (missing <= 0)
        if progress is not None:
            progress(sig, "measured" if missing > 0 else "stored")
    return replace(summary, signatures=summary.signatures + len(frameworks), measured=summary.measured + measured,
                   already_stored=summary.already_stored + stored)
