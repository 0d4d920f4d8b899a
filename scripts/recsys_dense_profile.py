"""Microbenchmarks of the dense ops of the DLRM experiments' tasks (bottom MLP, dot interaction, top MLP with the
loss; forward and backward; fp32, as measure.dlrm trains), each at the shapes of its task and batch, timed by
trainsim.profile.ops on the thread CPU clock with one torch thread and cold caches, into
data/recsys/cpu/dense_ops.db. The DLRM predictions then price these ops from the database (cost.profiled) instead
of the roofline with the CPU catalog entry's placeholder peaks. A timing campaign: run it under
`flock -x /tmp/trainsim-timing.lock`; resumable (measured signatures are skipped).

  python scripts/recsys_dense_profile.py [repeats]
"""

import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from recsys_experiments import BATCHES, CAP, CLUSTER, OUT, task

from trainsim.embedding.sharders import shard
from trainsim.frontends.catalog.sharded_dlrm import sharded_job
from trainsim.profile.database import ProfileDB
from trainsim.profile.ops import KernelHints, local_environment, profile_graph

DB = OUT / "dense_ops.db"
DENSE_LAYERS = ("bottom_mlp", "interaction", "top_mlp")


def main(repeats: int) -> None:
    import torch

    torch.set_num_threads(1)
    env = local_environment(CLUSTER.device.name, "cpu")
    began = time.monotonic()
    measured = 0
    with ProfileDB.open(DB) as db:
        for ranks in (2, 4):
            for kind, seed in [("heavy", s) for s in range(10)] + [("normal", 100 + s) for s in range(10)]:
                model, tables = task(kind, ranks, seed)
                plan = shard(tables, "size-lookup-greedy", ranks, cap_bytes=CAP, seed=seed)
                for batch in BATCHES:
                    graph = sharded_job(model, plan, CLUSTER, batch, precision="fp32").graph
                    dense = replace(graph, layers=tuple(la for la in graph.layers if la.name in DENSE_LAYERS))
                    summary = profile_graph(db, env, dense, KernelHints(bias=True), "cpu", warmup=2,
                                            repeats=repeats, optimizer=False)
                    measured += summary.measured
    print(f"{measured} signatures measured in {time.monotonic() - began:.0f} s -> {DB}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
