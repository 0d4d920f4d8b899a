"""aten._grouped_mm (transformers' grouped-GEMM experts path): a matmul whose FLOPs are 2 M N K of the operands as
laid out, and whose shape prices it as one GEMM of the groups' rows; flop_counter's registry has no formula."""

import pytest

torch = pytest.importorskip("torch")

from trainsim.frontends.torch.costs import op_flops, op_kind, op_shape  # noqa: E402

GROUPED_MM = torch.ops.aten._grouped_mm.default


def test_grouped_mm_experts_layout_counts_every_row_once() -> None:
    rows, hidden, out, experts = 12, 8, 16, 3  # 12 routed tokens over 3 experts' (8 x 16) weights
    a, b = torch.empty(rows, hidden), torch.empty(experts, hidden, out)
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    result = torch.empty(rows, out)
    assert op_kind("_grouped_mm") == "matmul"
    assert op_flops("_grouped_mm", GROUPED_MM, (a, b, offs), {}, result, None) == 2 * 12 * 8 * 16
    assert op_shape("_grouped_mm", "matmul", (a, b, offs), result) == (1, 12, 16, 8)


def test_grouped_mm_batched_and_split_k_layouts() -> None:
    batched = (torch.empty(3, 4, 8), torch.empty(3, 8, 16))
    assert op_flops("_grouped_mm", GROUPED_MM, batched, {}, torch.empty(3, 4, 16), None) == 2 * 3 * 4 * 8 * 16
    assert op_shape("_grouped_mm", "matmul", batched, torch.empty(3, 4, 16)) == (3, 4, 16, 8)
    split_k = (torch.empty(4, 24), torch.empty(24, 16), torch.tensor([8, 16, 24], dtype=torch.int32))
    assert op_flops("_grouped_mm", GROUPED_MM, split_k, {}, torch.empty(3, 4, 16), None) == 2 * 4 * 24 * 16
    split_n = (torch.empty(3, 4, 8), torch.empty(8, 48), torch.tensor([16, 32, 48], dtype=torch.int32))
    assert op_flops("_grouped_mm", GROUPED_MM, split_n, {}, torch.empty(4, 48), None) == 2 * 4 * 8 * 48
