"""Per-step costs that are not ops of the graph: the optimizer step and the framework's fixed overheads.

The engines ask a StepCosts for them, as they ask an OpCostModel for op times. FittedStepCosts is the default:
the Adam roofline and the calibration's fitted overheads (fitted on GPU clusters' runs). A profile database
stands in with measured ones (cost/profiled.py: ProfiledStepCosts).
"""

from typing import Protocol

from trainsim.catalog.calibration import Calibration
from trainsim.hardware.device import DeviceSpec
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision, policy_for


class StepCosts(Protocol):
    name: str

    def optimizer_step_s(self, params: float, precision: Precision, device: DeviceSpec,
                         zero_state_params: float = 0.0) -> float:
        """The optimizer step over `params` parameters held by one device, `zero_state_params` of them with an
        optimizer state that stays zero (cost/optimizer_zeros.py)."""
        ...

    def zero_state_share(self, model: str, samples: int, layer: int) -> float | None:
        """The measured share of a layer instance's parameters whose optimizer state stays zero in a run of the
        split executor on `samples` samples per step (profile/state_census.py), or None: not measured."""
        ...

    def grad_copies_s(self, params: float, device: DeviceSpec) -> float:
        """A gradient sync's copies of `params` gradients into flat buckets, scaled, and back (StackSpec.
        grad_bucket_copies)."""
        ...

    def iteration_overhead_s(self, device: DeviceSpec) -> float:
        """Host-side cost paid once per iteration."""
        ...

    def executor_overhead_s(self, family: str, fwd_ops: int, bwd_ops: int, device: DeviceSpec) -> float:
        """Host-side cost of one micro-batch of `fwd_ops` forward and `bwd_ops` backward graph ops of a model
        family ("cnn", "transformer", "dlrm") run by trainsim measure's split executor (StackSpec.split_executor),
        beyond the ops' kernels and the per-op autograd cost."""
        ...

    def executor_reshard_s(self, collective: str, phase: str, device: DeviceSpec) -> float:
        """Host-side cost of one reshard step running `collective` in `phase` ("fwd" or "bwd") as an autograd
        collective (trainsim measure's split executor, StackSpec.split_executor, and the reshards its tp splits
        add), beyond the collective and the step's copies."""
        ...

    def micro_batch_overhead_s(self, num_ops: int, num_layers: int, par: ParallelSpec,
                               device: DeviceSpec, tp_module_wrappers: bool = True) -> float:
        """Host-side cost of one micro-batch of a stage that runs `num_ops` graph ops (forward and backward) in
        `num_layers` transformer layers under the strategy `par`; `tp_module_wrappers`: the stack's tensor
        parallelism wraps the modules in torch's DTensor classes (StackSpec.tp_module_wrappers)."""
        ...


class FittedStepCosts:
    """Adam as a memory-bound roofline and the calibration's fitted per-iteration and per-micro-batch overheads."""

    name = "fitted"

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal

    def optimizer_step_s(self, params: float, precision: Precision, device: DeviceSpec,
                         zero_state_params: float = 0.0) -> float:
        """Adam reads and writes fp32 master weights and two moments, reads gradients, writes weights (the same
        bytes whatever the values: zero states are priced only where measured, cost/profiled.py)."""
        policy = policy_for(precision)
        per_param = 2 * (4 + policy.optimizer_state_bytes) + policy.grad_bytes + policy.weight_bytes
        return params * per_param / (device.hbm_bw_bytes_per_s * self.cal.compute.memory_efficiency)

    def zero_state_share(self, model: str, samples: int, layer: int) -> float | None:
        """Only a profile's census measures it."""
        return None

    def grad_copies_s(self, params: float, device: DeviceSpec) -> float:
        """Three memory-bound passes over fp32 gradients: each read and written (copy in, scale, copy out)."""
        return params * 3 * 2 * 4 / (device.hbm_bw_bytes_per_s * self.cal.compute.memory_efficiency)

    def iteration_overhead_s(self, device: DeviceSpec) -> float:
        return self.cal.runtime.iteration_overhead_s

    def executor_overhead_s(self, family: str, fwd_ops: int, bwd_ops: int, device: DeviceSpec) -> float:
        """Nothing is fitted for it: only a profile measures it (profile/executor_overhead.py)."""
        return 0.0

    def executor_reshard_s(self, collective: str, phase: str, device: DeviceSpec) -> float:
        """Nothing is fitted for it: only a profile measures it (profile/reshard_overhead.py)."""
        return 0.0

    def micro_batch_overhead_s(self, num_ops: int, num_layers: int, par: ParallelSpec,
                               device: DeviceSpec, tp_module_wrappers: bool = True) -> float:
        return self.cal.runtime.micro_batch_overhead_s
