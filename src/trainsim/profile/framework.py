"""Framework costs beyond the ops: what torch's tensor parallelism (DTensor) and FSDP2 add per layer.

With tensor parallelism every sharded module runs through DTensor (sharding propagation, redistribution and
the autograd functions around them); FSDP2 adds its hooks, parameter copy-in/copy-out and DTensor parameters
around every layer. Both are Python costs per op or per layer that dominate small models on CPUs. They are
measured here on one process: the model built twice at full size, plainly and with the same plan as
`trainsim measure` applies (measure/parallelize.py: apply_tp, apply_fsdp) over a mesh of one rank, where the
collectives move nothing. A micro-batch's forward and backward (with the vocab-parallel loss under tensor
parallelism) is timed for both, in pairs; the difference over the layers is the per-layer overhead: the
compute is the same in both and cancels. The collectives of a real run are the collective model's (gloo
microbenchmarks), not this.
"""

from trainsim.ir.model_spec import TransformerSpec
from trainsim.profile.database import OpSignature
from trainsim.strategy.precision import Precision, policy_for

FRAMEWORK_SIGNATURE_KIND = "framework"


FRAMEWORKS = ("dtensor-tp", "dtensor-tp-sp", "fsdp2-zero2", "fsdp2-zero3")


def framework_signature(framework: str, precision: Precision) -> OpSignature:
    """Per transformer layer and micro-batch (forward + backward), the framework's cost over the plain model."""
    assert framework in FRAMEWORKS, framework
    return OpSignature(FRAMEWORK_SIGNATURE_KIND, framework, "micro-batch", policy_for(precision).linear_dtype,
                       (1,))


def tp_framework(sp: bool) -> str:
    return "dtensor-tp-sp" if sp else "dtensor-tp"


def fsdp_framework(zero: int) -> str:
    return f"fsdp2-zero{zero}"


def frameworks_for(tp: int, sp: bool, zero: int) -> list[str]:
    """The frameworks whose per-layer cost a job pays: DTensor with tp > 1, FSDP2 with ZeRO-2/3 (`zero`: the
    stage that shards something, 0 when the data-parallel group is one rank)."""
    return ([tp_framework(sp)] if tp > 1 else []) + ([fsdp_framework(zero)] if zero >= 2 else [])


def measure_framework_overhead(spec: TransformerSpec, micro_batch: int, seq_len: int, precision: str,
                               framework: str, device: str, warmup: int, repeats: int) -> tuple[list[float], str]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from trainsim.measure.model import build_chunk, lm_loss, split_layers
    from trainsim.measure.parallelize import Topology, apply_fsdp, apply_tp
    from trainsim.profile.ops import clock_for

    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        from torch.distributed import HashStore  # type: ignore[attr-defined]

        dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(device, (1, 1, 1), mesh_dim_names=("pp", "dp", "tp"))
    plan = split_layers(spec.num_layers, 1)[0]
    with torch.device(device):
        plain = build_chunk(spec, plan)
        wrapped = build_chunk(spec, plan)
        topo = Topology(mesh, 0, 0, 0, 0)
        tensor_parallel = framework.startswith("dtensor-tp")
        if tensor_parallel:
            apply_tp(wrapped, spec, topo, framework == "dtensor-tp-sp")
        else:
            apply_fsdp(wrapped, topo, int(framework[-1]))
        gen = torch.Generator(device).manual_seed(0)
        tokens = torch.randint(0, spec.vocab, (micro_batch, seq_len + 1), generator=gen, device=device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    amp = precision.startswith("amp-")
    clock, clock_name = clock_for(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step_s(model: torch.nn.Module, vocab_parallel: bool) -> float:
        sync()
        start = clock()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            if vocab_parallel:
                with loss_parallel():
                    lm_loss(model(inputs), labels).backward()
            else:
                lm_loss(model(inputs), labels).backward()
        sync()
        return clock() - start

    for _ in range(max(1, warmup)):
        step_s(wrapped, tensor_parallel)
        step_s(plain, False)
    samples = [max(0.0, step_s(wrapped, tensor_parallel) - step_s(plain, False)) / spec.num_layers
               for _ in range(repeats)]
    return samples, (f"{framework} over plain, per layer, paired steps of {spec.name} mb={micro_batch} "
                     f"seq={seq_len} on a 1-rank mesh; {clock_name}")
