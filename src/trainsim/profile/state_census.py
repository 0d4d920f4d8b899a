"""Count the optimizer states that a split-executor run leaves at exactly zero, per layer.

Why: torch's CPU AdamW (torch.optim.adamw, torch 2.13, the single-tensor path the harnesses step) takes the square
root of exp_avg_sq every step, and torch's CPU sqrt is several times slower over zeros than over positive values
on this machine (2,560,000 fp32 elements, thread CPU time: 14-17 ms over zeros, 1.7-3.4 ms over values in
[0.5, 1.5)); cost/profiled.py prices the step as the random-state step and the all-zero-state step
(profile.ops.zero_state_optimizer_signature) mixed by the zero share. A state stays zero while the parameter's
gradient has been exactly zero at every step: an embedding row no lookup drew (derived, cost/optimizer_zeros.py)
or a weight between ReLU units that are dead (zero) for every sample of the batch. The second depends on the
weights and the data, which the op graph does not carry; this census measures it by running the training
numerics (no clock) of trainsim measure's split executor on the run's own samples and initialisation:

- one process, the plain plan (no splits), a micro-batch of all the data-parallel group's samples (micro_batch x
  dp: measure/split_model.make_data draws the group's samples from one seeded generator, so the same samples);
  the executor initialises each weight from a generator keyed by the op, whatever the plan, so the same weights;
- `steps` AdamW steps on the same micro-batches (SplitTrainer trains on them every step, as the runs do); after
  each step from `warmup` + 1 on (the timed steps), each layer's exp_avg_sq entries that are exactly 0 are
  counted; the census is their mean.

NB: a split plan's device holds part of a layer's weights; it is priced with the layer's share (the part's own
share can differ). The loss over the whole batch in one process and the runs' all-reduced per-rank losses agree up
to rounding; a unit dead for all samples is dead in both.
"""

import dataclasses
import tempfile
from pathlib import Path

from trainsim.errors import ConfigError
from trainsim.job import Job
from trainsim.profile.database import StateCensus


def census_job(job: Job) -> Job:
    """The job on one process with the whole data-parallel group's samples in its micro-batch."""
    par = job.parallel
    one = par.model_copy(update={"dp": 1, "micro_batch": par.micro_batch * par.dp,
                                 "global_batch": par.micro_batch * par.dp * par.num_micro_batches})
    return dataclasses.replace(job, parallel=one, cluster=job.cluster.on_one_node())


def count_zero_states(job: Job, steps: int, warmup: int, seed: int = 0,
                      dataflow: dict[str, list[str]] | None = None) -> StateCensus:
    """Run the census (in a fresh process: it opens a one-rank gloo group) and return it. dataflow: a CNN's layer
    inputs, as trainsim measure passes them (measure/split_model_files.dataflow_beside)."""
    if not (isinstance(steps, int) and isinstance(warmup, int) and 0 <= warmup < steps):
        raise ConfigError("steps", f"{steps} (warmup {warmup})", "must be an integer above warmup >= 0")
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        layers = pool.apply(_count, (census_job(job), steps, warmup, seed, dataflow))
    par = job.parallel
    return StateCensus(job.model.name, par.micro_batch * par.dp * par.num_micro_batches, steps, layers,
                       f"split executor, plain plan, 1 process, seed {seed}, mean over steps {warmup + 1}-{steps}")


def _count(job: Job, steps: int, warmup: int, seed: int,
           dataflow: dict[str, list[str]] | None) -> dict[int, tuple[float, float]]:
    import torch
    import torch.distributed as dist

    from trainsim.frontends.catalog.build import build_graph
    from trainsim.measure.split_model import Ranks, SplitTrainer
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree import StrategyTree

    torch.set_num_threads(1)
    with tempfile.NamedTemporaryFile(suffix=".rendezvous", delete=False) as rendezvous:  # a one-rank file store
        pass
    dist.init_process_group("gloo", init_method=f"file://{rendezvous.name}", rank=0, world_size=1)
    try:
        graph = build_graph(job.model, DeviceSlice.of(job.parallel))
        plan = StrategyTree.from_parallel(graph, job.parallel).lower(job.parallel)
        trainer = SplitTrainer(job, plan, {}, Ranks(1, 0), seed, dataflow)
        params: dict[int, float] = {}
        zeros: dict[int, float] = {}
        for step in range(steps):
            trainer.step()
            for unit in trainer.model.units:
                for param in unit.params:
                    layer = unit.layer.index
                    if step == 0:
                        params[layer] = params.get(layer, 0.0) + param.numel()
                    if step >= warmup:
                        state = trainer.optimizer.state[param]["exp_avg_sq"]
                        zeros[layer] = zeros.get(layer, 0.0) + float((state == 0).sum())
        return {layer: (count, zeros.get(layer, 0.0) / (steps - warmup)) for layer, count in params.items()}
    finally:
        dist.destroy_process_group()
        Path(rendezvous.name).unlink(missing_ok=True)
