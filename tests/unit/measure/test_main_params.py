"""A 16-bit model with fp32 main parameters (measure/parallelize.MainParams, `trainsim measure --precision bf16`):
the optimizer steps the fp32 copies and the model holds their 16-bit rounding."""

from pathlib import Path

import pytest

from conftest import tiny_job

torch = pytest.importorskip("torch")


def test_main_params_step_in_fp32_and_round_into_the_model() -> None:
    from torch import nn

    from trainsim.measure.parallelize import MainParams

    weight = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    main = MainParams([weight])
    assert main.main[0].dtype == torch.float32 and main.main[0].tolist() == [1.0, 2.0]
    weight.grad = torch.tensor([1.0, -1.0], dtype=torch.bfloat16)
    main.grads_to_main()
    assert main.main[0].grad is not None and main.main[0].grad.dtype == torch.float32
    assert weight.grad is None  # freed as its fp32 copy is made
    optimizer = torch.optim.SGD(main.main, lr=1e-3)
    optimizer.step()
    assert main.main[0].tolist() == pytest.approx([0.999, 2.001])  # kept in fp32
    main.main_to_model()
    assert weight.dtype == torch.bfloat16
    assert weight.tolist() == torch.tensor([0.999, 2.001]).to(torch.bfloat16).tolist()  # 16-bit rounding


def test_a_bf16_run_trains_a_16_bit_model(tmp_path: Path) -> None:
    from trainsim.measure.launch import launch, make_spec
    from trainsim.measure.results import load_run

    job = tiny_job(1, precision="bf16")
    run = load_run(launch(make_spec(job, tmp_path, iterations=2, warmup=1, timeout_s=90.0), 1))
    assert len(run.iteration_times_s) == 2 and run.final_loss is not None and run.final_loss == run.final_loss
    assert run.make_job().parallel.precision == "bf16"


def test_the_trainer_holds_bf16_weights_and_fp32_main_copies() -> None:
    import torch.distributed as dist

    from trainsim.measure.parallelize import Trainer, make_topology

    job = tiny_job(1, precision="bf16")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29547", rank=0, world_size=1)
    try:
        trainer = Trainer(job, make_topology(job, "cpu"), torch.device("cpu"))
        assert {p.dtype for p in trainer.params} == {torch.bfloat16}
        assert trainer.main_params is not None and {p.dtype for p in trainer.main_params.main} == {torch.float32}
        before = [p.detach().clone() for p in trainer.main_params.main]
        loss = trainer.step()
        assert loss == loss and all(p.grad is not None for p in trainer.main_params.main)
        moved = [not torch.equal(a, b) for a, b in zip(before, trainer.main_params.main, strict=True)]
        assert any(moved)
        for weight, main in zip(trainer.params, trainer.main_params.main, strict=True):
            assert torch.equal(weight.detach(), main.detach().to(torch.bfloat16))
    finally:
        dist.destroy_process_group()
