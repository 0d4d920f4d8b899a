"""The autocast rule table (strategy/autocast_rules.py) against torch's CUDA autocast: its registrations and, on
fake CUDA tensors, its behaviour (frontends/torch_probe.py). The table tests run without torch."""

from collections.abc import Callable
from typing import Any

import pytest

from trainsim.errors import ConfigError
from trainsim.strategy.autocast_rules import (
    CATEGORIES,
    cuda_autocast_table,
    dtype_for,
    normalize_op_name,
    widest,
)


def test_table_lists_are_disjoint_and_aliases_resolve() -> None:
    table = cuda_autocast_table()
    assert table.device == "cuda" and table.derived_from.startswith("torch")
    sizes = [len(table.ops(c)) for c in CATEGORIES]
    assert sum(sizes) == len(table.categories) and min(sizes) > 0
    for alias, target in table.aliases.items():
        assert table.category(alias) == table.categories[target]


@pytest.mark.parametrize(("op", "category"), [
    ("mm", "lower_precision"), ("aten.addmm.default", "lower_precision"), ("aten::linear", "lower_precision"),
    ("_scaled_dot_product_flash_attention_for_cpu", "lower_precision"), ("conv2d", "lower_precision"),
    ("_softmax", "fp32"), ("aten.pow.Tensor_Scalar", "fp32"), ("native_layer_norm", "fp32"), ("sum", "fp32"),
    ("nll_loss_forward", "fp32"), ("rms_norm", "fp32"), ("rsqrt", "fp32"), ("exp", "fp32"),
    ("cat", None), ("add", None), ("mean", None), ("silu", None), ("embedding", None),
    ("index_put", "promote"), ("addcmul", "promote"),
])
def test_categories(op: str, category: str | None) -> None:
    assert cuda_autocast_table().category(op) == category


def test_normalize_op_name() -> None:
    assert normalize_op_name("aten::pow.Tensor_Scalar") == "pow"
    assert normalize_op_name("aten.mm.default") == "mm"
    assert normalize_op_name("softmax") == "softmax"


@pytest.mark.parametrize(("precision", "op", "inputs", "weight", "expected"), [
    ("amp-bf16", "mm", ["fp32", "fp32"], True, "bf16"),
    ("amp-fp16", "bmm", ["fp32", "fp16"], False, "fp16"),
    ("amp-bf16", "_softmax", ["bf16"], False, "fp32"),
    ("amp-bf16", "pow", ["bf16"], False, "fp32"),
    ("amp-bf16", "add", ["bf16", "fp32"], False, "fp32"),
    ("amp-bf16", "mul", ["bf16", "bf16"], False, "bf16"),
    ("amp-bf16", "addcmul", ["bf16", "bf16", "fp32"], False, "fp32"),
    ("amp-bf16", "index_put", ["bf16", "bf16"], False, "bf16"),
    ("amp-fp16", "cat", ["fp16", "bf16"], False, "fp32"),
    ("fp32", "mm", ["fp32", "fp32"], True, "fp32"),
    ("tf32", "mm", ["fp32", "fp32"], True, "tf32"),
    ("tf32", "scaled_dot_product_attention", ["fp32"] * 3, False, "tf32"),
    ("tf32", "_softmax", ["fp32"], False, "fp32"),
    ("bf16", "mm", ["bf16", "bf16"], True, "bf16"),
    ("bf16", "_log_softmax", ["fp32"], False, "fp32"),  # the model's own upcast survives
    ("fp16", "add", ["fp16"], False, "fp16"),
    ("fp8", "mm", ["bf16", "bf16"], True, "fp8"),
    ("fp8", "bmm", ["bf16", "bf16"], False, "bf16"),  # attention GEMMs stay bf16
    ("fp8", "_softmax", ["bf16"], False, "bf16"),
    ("fp8", "zeros", [], False, "bf16"),
    ("amp-bf16", "zeros", [], False, "fp32"),
])
def test_dtype_for(precision: Any, op: str, inputs: list[Any], weight: bool, expected: str) -> None:
    assert dtype_for(op, inputs, precision, weight_operand=weight) == expected


def test_widest_follows_type_promotion() -> None:
    assert widest(["bf16", "fp16"]) == "fp32"
    assert widest(["bf16", "bf16"]) == "bf16"
    assert widest([]) is None


def test_unknown_precision_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="precision"):
        dtype_for("mm", ["fp32"], "int8")  # type: ignore[arg-type]


# ---- against torch --------------------------------------------------------------------------------------------

def test_table_matches_the_ops_torch_registers_for_autocast_cuda() -> None:
    """Registration check: the ops with an AutocastCUDA kernel in this torch build are exactly the table's."""
    torch = pytest.importorskip("torch")
    registered = {normalize_op_name(name) for name in torch._C._dispatch_get_all_op_names()
                  if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA")}
    table = set(cuda_autocast_table().categories)
    assert registered, "this torch build registers no AutocastCUDA kernels"
    assert registered == table, (f"re-derive catalog/data/autocast/cuda.yaml for torch {torch.__version__}: "
                                 f"missing {sorted(registered - table)}, stale {sorted(table - registered)}")


def _probe_cases(torch: Any) -> dict[str, Callable[[Callable[..., Any]], Any]]:
    """op -> call(make) where make(shape, dtype=fp32) builds a fake CUDA tensor."""
    f = torch.nn.functional
    idx = torch.int64
    return {
        "mm": lambda t: torch.mm(t((8, 8)), t((8, 8))),
        "addmm": lambda t: torch.addmm(t((8,)), t((8, 8)), t((8, 8))),
        "bmm": lambda t: torch.bmm(t((2, 8, 8)), t((2, 8, 8))),
        "baddbmm": lambda t: torch.baddbmm(t((2, 8, 8)), t((2, 8, 8)), t((2, 8, 8))),
        "linear": lambda t: f.linear(t((4, 8)), t((8, 8)), t((8,))),
        "matmul": lambda t: torch.matmul(t((2, 4, 8)), t((8, 8))),
        "einsum": lambda t: torch.einsum("bij,bjk->bik", t((2, 4, 8)), t((2, 8, 4))),
        "conv2d": lambda t: f.conv2d(t((2, 3, 8, 8)), t((4, 3, 3, 3))),
        "conv1d": lambda t: f.conv1d(t((2, 3, 8)), t((4, 3, 3))),
        "scaled_dot_product_attention": lambda t: f.scaled_dot_product_attention(
            t((2, 4, 16, 32)), t((2, 4, 16, 32)), t((2, 4, 16, 32)), is_causal=True),
        "softmax": lambda t: torch.softmax(t((8, 8)), -1),
        "log_softmax": lambda t: torch.log_softmax(t((8, 8)), -1),
        "layer_norm": lambda t: f.layer_norm(t((4, 8)), (8,), t((8,)), t((8,))),
        "group_norm": lambda t: f.group_norm(t((2, 4, 8)), 2),
        "rms_norm": lambda t: f.rms_norm(t((4, 8)), (8,), t((8,))),
        "pow": lambda t: torch.pow(t((8,)), 2),
        "exp": lambda t: torch.exp(t((8,))),
        "log": lambda t: torch.log(t((8,))),
        "rsqrt": lambda t: torch.rsqrt(t((8,))),
        "sum": lambda t: torch.sum(t((8,))),
        "cumsum": lambda t: torch.cumsum(t((8,)), 0),
        "mse_loss": lambda t: f.mse_loss(t((8,)), t((8,))),
        "nll_loss": lambda t: f.nll_loss(t((4, 8)), t((4,), idx)),
        "binary_cross_entropy_with_logits": lambda t: f.binary_cross_entropy_with_logits(t((8,)), t((8,))),
        "l1_loss": lambda t: f.l1_loss(t((8,)), t((8,))),
        "smooth_l1_loss": lambda t: f.smooth_l1_loss(t((8,)), t((8,))),
        "softplus": lambda t: f.softplus(t((8,))),
        "cosine_similarity": lambda t: f.cosine_similarity(t((4, 8)), t((4, 8))),
        "addcmul": lambda t: torch.addcmul(t((8,)), t((8,)), t((8,))),
        "addcdiv": lambda t: torch.addcdiv(t((8,)), t((8,)), t((8,))),
        "atan2": lambda t: torch.atan2(t((8,)), t((8,))),
        "add": lambda t: torch.add(t((8,)), t((8,))),
        "mul": lambda t: torch.mul(t((8,)), t((8,))),
        "gelu": lambda t: f.gelu(t((8,))),
        "silu": lambda t: f.silu(t((8,))),
        "tanh": lambda t: torch.tanh(t((8,))),
        "mean": lambda t: torch.mean(t((8,))),
        "cat": lambda t: torch.cat([t((8,)), t((8,))]),
        "embedding": lambda t: f.embedding(t((4,), idx), t((16, 8))),
    }


@pytest.mark.parametrize("precision", ["amp-bf16", "amp-fp16"])
@pytest.mark.parametrize("input_dtype", ["fp32", "half", "mixed"])
def test_fake_cuda_probe_agrees_with_the_table(precision: str, input_dtype: str) -> None:
    """Behaviour check: torch's AutocastCUDA kernels, run on fake CUDA tensors, give dtype_for's dtype."""
    torch = pytest.importorskip("torch")
    from trainsim.frontends.torch.probe import cuda_autocast, fake_cuda, probe

    half = torch.bfloat16 if precision == "amp-bf16" else torch.float16
    half_name = "bf16" if precision == "amp-bf16" else "fp16"
    checked: list[str] = []
    with cuda_autocast(precision):
        for op, call in _probe_cases(torch).items():
            made: list[str] = []

            def make(shape: tuple[int, ...], dtype: Any = None, made: list[str] = made) -> Any:
                if dtype is not None:  # integer index inputs
                    return fake_cuda(shape, dtype)
                use_half = input_dtype == "half" or (input_dtype == "mixed" and len(made) % 2 == 0)
                made.append(half_name if use_half else "fp32")
                return fake_cuda(shape, half if use_half else torch.float32)

            got = probe(lambda call=call, make=make: call(make))
            if got is None:
                continue
            expected = dtype_for(op, made, precision)  # type: ignore[arg-type]
            assert got == expected, f"{op} on {made}: torch autocast gives {got}, the table {expected}"
            checked.append(op)
    assert {"mm", "linear", "scaled_dot_product_attention", "softmax", "layer_norm", "pow", "rsqrt", "sum",
            "nll_loss", "addcmul", "add", "embedding"} <= set(checked)
