"""Local gloo sweep of all-to-all and all-reduce on 2 and 4 ranks into data/recsys/cpu/collectives.db (the data the
sigmoid curves are fitted on). Usage: python scripts/recsys_gloo_sweep.py [DB]   (default that file; a timing
campaign: under the timing lock, and with the ranks prioritized as scripts/recsys_quiet.py describes)"""

import sys
from pathlib import Path

from trainsim.profile.collectives import profile_collectives
from trainsim.profile.database import ProfileDB
from trainsim.profile.ops import local_environment

SIZES = tuple(256 * 2**i for i in range(16))  # 256 B ... 8 MiB


def main(path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    env = local_environment("cpu-local", "cpu")
    with ProfileDB.open(path) as db:
        for world in (2, 4):
            summary = profile_collectives(db, env, collectives=("all-to-all", "all-reduce"), sizes=SIZES,
                                          world_size=world, warmup=2, repeats=7, timeout_s=900.0)
            print(world, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("data/recsys/cpu/collectives.db"))
