"""Megatron's unfused attention in the measured model: the same function as torch SDPA (dropout off), its
gradients too; a measured run records the kernel it ran; flash3 is refused."""

from pathlib import Path
from typing import Any

import pytest

from conftest import MEASURED_GPT, MEASURED_LLAMA, tiny_job
from trainsim.ir.model_spec import TransformerSpec
from trainsim.measure.launch import check_supported, launch, make_spec
from trainsim.measure.results import load_run

MODELS: list[dict[str, Any]] = [MEASURED_GPT, MEASURED_LLAMA,
                                {**MEASURED_GPT, "name": "tiny-bloom", "position": "alibi"}]


@pytest.mark.parametrize("data", MODELS, ids=lambda d: d["name"])
def test_unfused_model_computes_what_the_fused_one_does(data: dict[str, Any]) -> None:
    """Causal GPT, grouped-query LLaMA and ALiBi BLOOM: the math model's logits and weight gradients equal the
    SDPA model's (same seed, eval mode: no attention dropout)."""
    torch = pytest.importorskip("torch")
    from trainsim.measure.model import Block, build_model, lm_loss

    spec = TransformerSpec.model_validate({**data, "num_layers": 2})
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for kernel in ("flash2", "math"):
        model = build_model(spec, seed=3, attention=kernel).eval()
        logits = model(tokens)
        lm_loss(logits, tokens).backward()
        block = model.layers["0"]
        assert isinstance(block, Block)
        grads.append((logits, block.attn.q.weight.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-4, atol=1e-6)


def test_unfused_attention_drops_probabilities_in_training() -> None:
    """In training mode the math kernel applies Megatron's attention dropout (0.1): outputs differ from eval."""
    torch = pytest.importorskip("torch")
    from trainsim.measure.model import MATH_ATTENTION_DROPOUT, build_model

    spec = TransformerSpec.model_validate({**MEASURED_GPT, "num_layers": 1})
    model = build_model(spec, seed=3, attention="math")
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    assert MATH_ATTENTION_DROPOUT == 0.1
    assert not torch.allclose(model.train()(tokens), model.eval()(tokens))


def test_a_math_run_records_its_kernel(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    job = tiny_job(1, attention="math")
    run = load_run(launch(make_spec(job, tmp_path, iterations=2, warmup=1, timeout_s=90.0), 1))
    assert run.make_job().parallel.attention == "math" and len(run.iteration_times_s) == 2


def test_a_tensor_parallel_math_run_trains(tmp_path: Path) -> None:
    """tp=2 with sequence parallelism: each rank's unfused core runs on its local heads (LLaMA: GQA and RoPE)."""
    pytest.importorskip("torch")
    job = tiny_job(2, MEASURED_LLAMA, tp=2, sp=True, global_batch=4, precision="amp-bf16", attention="math")
    run = load_run(launch(make_spec(job, tmp_path, iterations=2, warmup=1, timeout_s=90.0), 2))
    assert run.final_loss is not None and len(run.iteration_times_s) == 2


def test_flash3_is_refused() -> None:
    with pytest.raises(Exception, match="attention=flash3 is not measured; choose one of flash2, math"):
        check_supported(tiny_job(1, attention="flash3"), "cpu")
