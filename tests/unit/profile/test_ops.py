"""Op microbenchmarks' choices that need no timing (profile.ops): which ops start cold, a core's share of the
last-level cache, and the tensors the optimizer step walks."""

import dataclasses
from pathlib import Path

from trainsim.catalog.loader import load_model
from trainsim.frontends.catalog.build import build_graph
from trainsim.ir.flops import conv_op
from trainsim.ir.graph import Layer, OpGraph
from trainsim.profile.job import hints_for
from trainsim.profile.ops import _cache_sharers, footprints, parameter_tensors, signature_of, starts_cold
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec

MIB = 2**20


def test_an_op_that_fits_its_cores_share_of_the_cache_starts_warm_on_a_cpu_only() -> None:
    assert not starts_cold("cpu", 4 * MIB, 4 * MIB)
    assert starts_cold("cpu", 4 * MIB + 1, 4 * MIB)
    assert starts_cold("cuda", 1024, 4 * MIB)  # a GPU's ops are always timed after a flush


def test_the_cpus_sharing_a_cache_are_counted_from_sysfs(tmp_path: Path) -> None:
    (tmp_path / "shared_cpu_list").write_text("0-1,4,6-7\n")
    assert _cache_sharers(str(tmp_path)) == 5
    assert _cache_sharers(str(tmp_path / "missing")) == 1


def test_footprints_take_the_largest_op_of_a_signature() -> None:
    small = dataclasses.replace(conv_op("a", "a", "fp32", 2, 16, 16, (3, 3), 1, (8, 8)), kernel="3x3s1")
    same = dataclasses.replace(small, name="b", bytes_moved=small.bytes_moved * 3)
    graph = OpGraph("g", (Layer("l", "conv_block", 1, (small, same), (), (), 0.0, 0.0),), 1, 1)
    sig = signature_of(small)
    assert sig is not None and sig == signature_of(same)
    assert footprints(graph) == {sig: small.bytes_moved * 3}


def test_a_cnns_optimizer_walks_a_weight_per_convolution_and_two_tensors_per_batch_norm() -> None:
    """ResNet-50: 53 convolutions (no bias), 53 BatchNorms (scale and shift of their channels) and the fc layer's
    weight and bias: 161 tensors, as torch's model holds them (the CPU AdamW step costs ~0.1 ms per tensor)."""
    model = load_model("resnet50")
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 1, "global_batch": 2})
    dev = DeviceSlice.of(par)
    sizes = parameter_tensors(build_graph(model, dev), hints_for(model, dev))
    assert len(sizes) == 161
    assert sum(sizes) == 25_557_032  # torchvision's resnet50 parameters
    assert 64 * 3 * 7 * 7 in sizes and sizes.count(64) >= 2  # conv1's weight; bn1's scale and shift


def test_the_zero_state_optimizer_probe_steps_over_all_zero_gradients() -> None:
    import torch

    from trainsim.profile.ops import _adam_samples

    threads = torch.get_num_threads()
    samples, detail, _ = _adam_samples([64, 8], "cpu", 0, 2, threads, zero_state=True)
    assert len(samples) == 2 and all(s > 0 for s in samples)
    assert "all-zero gradients" in detail
    assert "random gradients" in _adam_samples([64, 8], "cpu", 0, 1, threads)[1]


def test_a_reshard_copy_is_timed_as_a_concatenation_of_strided_parts() -> None:
    """compile.splits' copy op (a reshard's host copies) has its own kernel: torch.cat of two column halves of the
    op's elements, in rows of the model's width; either phase runs the same copy."""
    import torch

    from trainsim.ir.graph import COPY_OP, Op
    from trainsim.profile.ops import KernelHints, build_kernel

    op = Op(COPY_OP, "elementwise", "reshard", "bwd", "fp32", 0.0, 2.0 * 4 * 4096, (4096,))
    sig = signature_of(op)
    assert sig is not None and (sig.kind, sig.impl, sig.shape) == ("elementwise", COPY_OP, (4096,))
    run, detail = build_kernel(sig, KernelHints(hidden=256), "cpu")
    out = run()
    assert isinstance(out, torch.Tensor) and out.shape == (16, 256)
    assert detail == "cat of 2 column parts of rows of 256"
