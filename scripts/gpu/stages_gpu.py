"""Every stage of two GPU-sized models measured alone on one GPU, for PredTOP's and MPE's experiments
(mesh = 1 GPU; see docs/planning.md). The models follow scripts/stage_experiments.py's pair (a GPT-style chain
with a heavy head, a GShard-style MoE with every second block 4 experts, top-1) at a size where a stage takes
milliseconds on an H100: hidden 1024, 16 blocks (18 units: embedding + blocks + head, 171 stages each),
micro-batch 8 x 512 tokens, fp32 weights with TF32 matrix products.

    python scripts/gpu/stages_gpu.py --db OUT/stages_gpu.db [--device cuda|cpu] [--budget-s 150]

Resumable: stages already in the database are skipped. Rows are keyed by the model's name and spec hash
(measure.stage_db.model_key), micro-batch, sequence length, and threads = 0 (a GPU, not a CPU thread count).
"""

import argparse
import random
import time
from pathlib import Path

from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.stage_db import StageDatabase, StageEstimate, model_key
from trainsim.strategy.stage_plan import IntraPlan, Mesh, StageSpec

GPT_GPU = TransformerSpec(name="gpt-gpu", arch="gpt", num_layers=16, hidden=1024, ffn_hidden=4096, num_heads=16,
                          vocab=50304, max_seq_len=512)
MOE_GPU = TransformerSpec(name="moe-gpu", arch="gpt", num_layers=16, hidden=1024, ffn_hidden=4096, num_heads=16,
                          vocab=32768, max_seq_len=512, num_experts=4, top_k=1, moe_every=2)
MODELS = {"gpt": GPT_GPU, "moe": MOE_GPU}
MICRO_BATCH, SEQ_LEN, GPU_THREADS = 8, 512, 0


def stages_of(model: TransformerSpec) -> list[StageSpec]:
    units = model.num_layers + 2
    return [StageSpec(a, b, Mesh(1, 1), IntraPlan()) for a in range(units) for b in range(a + 1, units + 1)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args()

    import torch

    from trainsim.measure.stage import measure_stages_local

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    started = time.perf_counter()
    db = StageDatabase(args.db)
    for name in args.models:
        model = MODELS[name]
        key = model_key(model)
        todo = [s for s in stages_of(model) if db.get(key, MICRO_BATCH, SEQ_LEN, GPU_THREADS, s) is None]
        random.Random(0).shuffle(todo)  # a budget cut leaves a random sample of the stages, as PredTOP samples
        for stage in todo:
            if time.perf_counter() - started > args.budget_s:
                print(f"stages: out of time; {db.count(key)} of {len(stages_of(model))} {name} stages", flush=True)
                return
            try:
                timing = measure_stages_local(model, [stage], MICRO_BATCH, SEQ_LEN, args.warmup, args.iterations,
                                              device=args.device)[0]
            except torch.OutOfMemoryError:
                print(f"stages: {name} {stage.first}-{stage.end} ran out of memory; skipped", flush=True)
                continue
            finally:
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            if args.device == "cuda" and db.count(key) % 25 == 0:
                print(f"stages: {db.count(key)} measured, {torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated",
                      flush=True)
            db.put(key, MICRO_BATCH, SEQ_LEN, GPU_THREADS, stage,
                   StageEstimate(timing.latency_s, timing.state_bytes, timing.activation_bytes), timing.samples_s)
        print(f"stages: {name} done, {db.count(key)} stages, {time.perf_counter() - started:.0f} s", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
