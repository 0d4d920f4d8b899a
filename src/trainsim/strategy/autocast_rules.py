"""Per-op precision: the dtype each op runs in under a precision policy.

For amp-fp16 / amp-bf16 this is torch.autocast's CUDA policy, kept as data in catalog/data/autocast/cuda.yaml
(three lists: lower precision, fp32, promote, plus the aliases a dispatch-level trace needs). The other policies
are rules: fp32 runs everything in fp32; tf32 runs the tensor-core ops (the ops autocast would lower: GEMMs,
convolutions, attention) in tf32 and the rest in fp32; fp16 / bf16 run each op in the widest dtype of its
inputs (the model's own casts, such as an fp32 loss, survive); fp8 runs linear-layer GEMMs (a GEMM with a
weight operand) in fp8 and everything else as bf16.

No torch import: the table is plain data, used by the torch front-end and by any other front-end.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Literal

from trainsim.catalog.files import DATA_DIR, read_mapping
from trainsim.errors import ConfigError
from trainsim.hardware.device import DType
from trainsim.strategy.precision import PRECISIONS, Precision

Category = Literal["lower_precision", "fp32", "promote"]
CATEGORIES: tuple[Category, ...] = ("lower_precision", "fp32", "promote")

# GEMM-shaped ops: under fp8 the ones with a weight operand run in fp8 (Transformer Engine's Linear).
_GEMMS = frozenset({"mm", "addmm", "linear", "matmul", "bmm", "baddbmm", "addbmm", "addmv", "mv", "einsum"})
_WIDTH: dict[DType, int] = {"fp8": 0, "fp16": 1, "bf16": 1, "tf32": 2, "fp32": 2}


@dataclass(frozen=True, slots=True)
class AutocastTable:
    """One device type's autocast policy: op name -> category, and trace-level aliases -> op name."""

    device: str
    derived_from: str
    categories: dict[str, Category]
    aliases: dict[str, str]

    def category(self, op_name: str) -> Category | None:
        """The policy of an op given as `mm`, `aten.mm`, `aten::pow.Tensor_Scalar` or an alias (`_softmax`)."""
        name = normalize_op_name(op_name)
        return self.categories.get(self.aliases.get(name, name))

    def ops(self, category: Category) -> frozenset[str]:
        return frozenset(name for name, cat in self.categories.items() if cat == category)


def normalize_op_name(op_name: str) -> str:
    """`aten::pow.Tensor_Scalar`, `aten.pow.Tensor_Scalar`, `pow.Tensor_Scalar` -> `pow`."""
    name = op_name.split("::", 1)[-1]
    if name.startswith("aten."):
        name = name[len("aten."):]
    return name.split(".", 1)[0]


@cache
def cuda_autocast_table() -> AutocastTable:
    return load_autocast_table("cuda")


def load_autocast_table(device: str) -> AutocastTable:
    path = DATA_DIR / "autocast" / f"{device}.yaml"
    if not path.exists():
        raise ConfigError("autocast device", device, "only the cuda policy is kept (catalog/data/autocast/cuda.yaml)")
    data = read_mapping(path)
    categories: dict[str, Category] = {}
    for category in CATEGORIES:
        for name in data.get(category) or []:
            if name in categories:
                raise ConfigError(f"{path}: {name}", category, f"already listed under {categories[name]}")
            categories[str(name)] = category
    aliases = {str(k): str(v) for k, v in (data.get("aliases") or {}).items()}
    for alias, target in aliases.items():
        if target not in categories:
            raise ConfigError(f"{path}: aliases.{alias}", target, "must name an op of the three lists")
    return AutocastTable(str(data.get("device", device)), str(data.get("derived_from", "")), categories, aliases)


def widest(dtypes: Iterable[DType]) -> DType | None:
    """The dtype type promotion picks among floating inputs (fp16 with bf16 -> fp32, as torch does)."""
    found = set(dtypes)
    if not found:
        return None
    best = max(found, key=lambda d: _WIDTH[d])
    if _WIDTH[best] == 1 and found >= {"fp16", "bf16"}:
        return "fp32"
    return best


def dtype_for(op_name: str, input_dtypes: Iterable[DType], precision: Precision, *,
              weight_operand: bool = False) -> DType:
    """The dtype op `op_name` runs in under `precision`, given the dtypes of its floating inputs.

    weight_operand: the op reads a parameter (a linear layer's GEMM); only fp8 looks at it.
    An op with no floating inputs (a factory op, an integer op) runs in fp32, or in bf16 under fp8.
    """
    if precision not in PRECISIONS:
        raise ConfigError("precision", precision, "choose one of: " + ", ".join(PRECISIONS))
    inputs = tuple(input_dtypes)
    table = cuda_autocast_table()
    category = table.category(op_name)
    if precision == "fp32":
        return "fp32"
    if precision == "tf32":
        return "tf32" if category == "lower_precision" else "fp32"
    if precision in ("amp-fp16", "amp-bf16"):
        half: DType = "fp16" if precision == "amp-fp16" else "bf16"
        if category == "lower_precision":
            return half
        if category == "fp32":
            return "fp32"
        return widest(inputs) or "fp32"  # promote list, and ops autocast leaves alone
    if precision == "fp8":
        if weight_operand and normalize_op_name(op_name) in _GEMMS:
            return "fp8"
        found = widest(d for d in inputs if d != "fp8")
        return found or "bf16"
    return widest(inputs) or "fp32"  # fp16 / bf16: the model's own dtypes decide
