"""Ordering check: the GPT-2 strategies of the Proteus paper's Table V, predicted and ranked.

Proteus, Table V: GPT-2 trained with DP x MP x PP (micro-batches) on HC1 (8 Titan Xp on PCIe,
global batch 8) and HC2 (2 nodes x 8 V100 with NVLink, 100 Gb/s between nodes, global batch 64); the true
rank is by measured throughput. NB: the paper's Table III (model sizes) did not survive text extraction;
"GPT-2" is taken as GPT-2 medium (355M, sequence 1024), fp32 (PyTorch 1.8, Titan Xp has no tensor cores),
GPipe for the pipelined plans. Assumptions, not facts of the paper.
"""

from dataclasses import dataclass

from trainsim.catalog import load_cluster, load_model
from trainsim.estimate.engines import Estimator, make_engine, shape_engines
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.validate.metrics import kendall_tau

MODEL = "gpt2-355m"
SEQ_LEN = 1024


@dataclass(frozen=True, slots=True)
class TablePlan:
    dp: int
    mp: int
    pp: int
    micro_batches: int
    true_rank: int

    @property
    def label(self) -> str:
        return f"{self.dp}x{self.mp}x{self.pp}({self.micro_batches})"


@dataclass(frozen=True, slots=True)
class Platform:
    name: str
    cluster: str
    num_gpus: int
    global_batch: int
    plans: tuple[TablePlan, ...]


PLATFORMS = (
    Platform("HC1", "titanxp-pcie-8", 8, 8, (
        TablePlan(8, 1, 1, 1, 2), TablePlan(4, 2, 1, 1, 1), TablePlan(2, 4, 1, 1, 3),
        TablePlan(1, 8, 1, 1, 5), TablePlan(2, 2, 2, 1, 6), TablePlan(2, 2, 2, 2, 4))),
    Platform("HC2", "v100-100g", 16, 64, (
        TablePlan(16, 1, 1, 1, 1), TablePlan(8, 2, 1, 1, 2), TablePlan(4, 4, 1, 1, 3),
        TablePlan(2, 8, 1, 1, 4), TablePlan(8, 1, 2, 4, 6), TablePlan(8, 1, 2, 8, 5),
        TablePlan(2, 4, 2, 4, 7))),
)


@dataclass(frozen=True, slots=True)
class RankedPlatform:
    platform: str
    labels: list[str]
    throughput: list[float]  # predicted samples/s
    true_rank: list[int]
    predicted_rank: list[int]
    tau: float


def rank_platform(platform: Platform, estimator: Estimator) -> RankedPlatform:
    model = load_model(MODEL)
    cluster = load_cluster(platform.cluster).with_num_gpus(platform.num_gpus)
    throughput: list[float] = []
    for plan in platform.plans:
        micro = platform.global_batch // plan.dp // plan.micro_batches
        par = ParallelSpec(tp=plan.mp, pp=plan.pp, dp=plan.dp, micro_batch=micro, global_batch=platform.global_batch,
                           seq_len=SEQ_LEN, precision="fp32", schedule="gpipe")
        job = make_job(model, cluster, par)
        throughput.append(estimator.estimate(job, graph_for(job)).samples_per_s)
    order = sorted(range(len(throughput)), key=lambda i: -throughput[i])
    predicted = [0] * len(order)
    for rank, index in enumerate(order, start=1):
        predicted[index] = rank
    true = [plan.true_rank for plan in platform.plans]
    # tau between true and predicted rankings (ranks: lower is better, so compare them directly)
    return RankedPlatform(platform.name, [p.label for p in platform.plans], throughput, true, predicted,
                          kendall_tau([float(r) for r in true], [float(r) for r in predicted]))


def main() -> None:
    """python -m trainsim.validate.proteus_table5: the ranking under every registered engine."""
    for engine in shape_engines():
        for platform in PLATFORMS:
            ranked = rank_platform(platform, make_engine(engine))
            print(f"{engine:<11} {ranked.platform}  Kendall tau = {ranked.tau:+.3f}")
            print(f"  {'plan':<11}{'samples/s':>10}{'true':>6}{'pred':>6}")
            for label, rate, true, pred in zip(ranked.labels, ranked.throughput, ranked.true_rank,
                                               ranked.predicted_rank, strict=True):
                print(f"  {label:<11}{rate:>10.1f}{true:>6}{pred:>6}")


if __name__ == "__main__":
    main()
