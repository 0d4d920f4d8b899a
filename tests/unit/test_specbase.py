"""Spec.replaced: the copy model_copy(update=...) makes, by a shorter path."""

from trainsim.catalog.loader import load_cluster
from trainsim.strategy.parallel import ParallelSpec


def test_replaced_equals_model_copy() -> None:
    base = ParallelSpec(tp=2, pp=2, micro_batch=2, global_batch=64, seq_len=512)
    for changes in ({"dp": 8}, {"recompute": "full", "zero": 3}, {}):
        fast, slow = base.replaced(**changes), base.model_copy(update=changes)
        assert fast == slow and fast.model_fields_set == slow.model_fields_set
        assert fast.__dict__ == slow.__dict__ and fast is not base
        assert fast.describe() == slow.describe() and hash(fast) == hash(slow)
    assert base.replaced(dp=8).dp == 8 and base.dp == 0  # the original unchanged


def test_replaced_of_another_spec() -> None:
    device = load_cluster("dgx-h100-80gb").device
    assert device.replaced(compute_share=0.5) == device.model_copy(update={"compute_share": 0.5})
    assert device.replaced(compute_share=0.5).compute_share == 0.5
