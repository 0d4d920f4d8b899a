"""The front-end registry: every front-end gives model_spec(source) and graph(source, job); bad sources and
strategies a front-end cannot build are refused; a Hugging Face Llama config through the torch front-end is
priced within 1% of the catalog's."""

import json
from pathlib import Path

import pytest

from conftest import EXEC_TRACES, TESTS_DIR
from trainsim.catalog import load_cluster, load_model
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.frontends.catalog.build import build_graph
from trainsim.frontends.registry import FRONTENDS
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import OpaqueSpec, TransformerSpec
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec

FIXTURES = EXEC_TRACES
JAX_FACTORY = str(TESTS_DIR / "unit" / "frontends" / "jax" / "test_jax_capture.py") + ":gpt_step_factory"
LLAMA_8B = {"model_type": "llama", "_name_or_path": "llama3.1-8b", "num_hidden_layers": 32, "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "attention_bias": False, "tie_word_embeddings": False}
TINY_LLAMA = {**LLAMA_8B, "_name_or_path": "tiny-llama", "num_hidden_layers": 2, "hidden_size": 128,
              "intermediate_size": 352, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 256}


def predict_iteration_s(job: Job, graph: OpGraph) -> float:
    """The analytical engine's iteration time of `graph` for `job` (the one place the engine API is used)."""
    return AnalyticalEstimator().estimate(job, graph).iteration_time_s


def _config(tmp_path: Path, config: dict[str, object], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def _job(spec: object, num_gpus: int = 1, **parallel: object) -> Job:
    cluster = load_cluster("local-cpu").with_num_gpus(num_gpus)
    return make_job(spec, cluster, ParallelSpec.model_validate(parallel))  # type: ignore[arg-type]


def test_the_four_front_ends_are_registered() -> None:
    assert FRONTENDS.names() == ["catalog", "jax", "torch", "trace"]
    assert all(FRONTENDS.get(name).name == name for name in FRONTENDS.names())


# ---- catalog ----------------------------------------------------------------------------------------------------
def test_catalog_graph_is_the_builder_graph_of_the_job() -> None:
    frontend = FRONTENDS.get("catalog")
    spec = frontend.model_spec("gpt3-125m")
    assert spec == load_model("gpt3-125m")
    job = _job(spec, 2, tp=2, sp=True, seq_len=256)
    graph = frontend.graph("gpt3-125m", job)
    assert graph == build_graph(spec, DeviceSlice.of(job.parallel))
    assert any(c.axis == "tp" for layer in graph.layers for c in layer.comms)


def test_catalog_reads_a_hugging_face_folder(tmp_path: Path) -> None:
    _config(tmp_path, TINY_LLAMA)
    spec = FRONTENDS.get("catalog").model_spec(str(tmp_path))
    assert isinstance(spec, TransformerSpec) and (spec.name, spec.hidden, spec.kv_heads) == ("tiny-llama", 128, 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"config\.json"):
        FRONTENDS.get("catalog").model_spec(str(tmp_path / "empty"))


def test_catalog_refuses_an_unknown_model() -> None:
    with pytest.raises(ConfigError, match="no-such-model"):
        FRONTENDS.get("catalog").model_spec("no-such-model")


# ---- trace ------------------------------------------------------------------------------------------------------
def test_trace_graph_carries_what_the_run_measured() -> None:
    frontend = FRONTENDS.get("trace")
    spec = frontend.model_spec(str(FIXTURES))
    assert isinstance(spec, OpaqueSpec) and spec.published_params == 3 * (256 * 256 + 256) + 257
    graph = frontend.graph(str(FIXTURES), _job(spec, 2, micro_batch=64))
    measured = graph.measured
    assert measured is not None and measured.ranks == (0, 1) and len(measured.exec_graph.devices) == 2
    # measured on the 2-core development machine (test_exec_trace.py): 8.541 ms (rank 0) and 6.926 ms (rank 1)
    assert measured.measured_step_s == pytest.approx((8.541e-3, 6.926e-3), abs=1e-6)
    assert measured.start_offset_s[0] == 0.0 or measured.start_offset_s[1] == 0.0
    assert graph.param_count() == spec.published_params and graph.samples_per_micro_batch == 64


def test_trace_refuses_another_run() -> None:
    frontend = FRONTENDS.get("trace")
    spec = frontend.model_spec(str(FIXTURES))
    with pytest.raises(ConfigError, match="num_gpus=1"):
        frontend.graph(str(FIXTURES), _job(spec, 1, micro_batch=64))
    with pytest.raises(ConfigError, match="micro_batch=8"):
        frontend.graph(str(FIXTURES), _job(spec, 2, micro_batch=8))
    with pytest.raises(ConfigError, match="missing"):
        frontend.model_spec(str(FIXTURES / "missing"))


def test_trace_refuses_tp_naming_the_module_paths_it_lacks() -> None:
    """The execution trace holds each op's tensor shapes (a GEMM's weight dims among them), not the module paths
    a tree's splits address: tp is refused in one line saying so, wherever the job comes from."""
    frontend = FRONTENDS.get("trace")
    spec = frontend.model_spec(str(FIXTURES))
    graph = frontend.inspect(str(FIXTURES), 64, 1, "fp32")
    assert {op.module_path.split(".")[0] for layer in graph.layers for op in layer.fwd} == {"trace"}
    assert len(graph.layers) == 1 and any(op.kind == "matmul" and len(op.shape) == 4 for op in graph.layers[0].fwd)
    cluster = load_cluster("local-cpu").with_num_gpus(2)
    for make in (lambda: _job(spec, 2, tp=2, micro_batch=64),  # make_job: the spec says why
                 lambda: frontend.graph(str(FIXTURES), Job(spec, cluster, ParallelSpec(tp=2, dp=1, micro_batch=64)))):
        with pytest.raises(ConfigError) as info:
            make()
        message = str(info.value)
        assert message.startswith("tp=2 is invalid") and "records no module paths" in message and "\n" not in message


def test_trace_refuses_cp_and_ep_as_make_job_does() -> None:
    """The trace's graph() refuses cp and ep by the spec's check, in make_job's words, wherever the job comes
    from (one refusal for an opaque model, not a second one in the front-end's words)."""
    frontend = FRONTENDS.get("trace")
    spec = frontend.model_spec(str(FIXTURES))
    cluster = load_cluster("local-cpu").with_num_gpus(2)
    for field, parallel in (("cp", ParallelSpec(cp=2, dp=1, micro_batch=64)),
                            ("ep", ParallelSpec(ep=2, dp=2, micro_batch=64))):
        with pytest.raises(ConfigError) as by_make_job:
            make_job(spec, cluster, parallel)
        with pytest.raises(ConfigError) as by_graph:
            frontend.graph(str(FIXTURES), Job(spec, cluster, parallel))
        assert str(by_make_job.value) == str(by_graph.value) == (f"{field}=2 is invalid: must be 1 for a model of "
                                                                 "kind opaque (only dp and pp apply)")


# ---- jax --------------------------------------------------------------------------------------------------------
def test_jax_graph_of_a_factory() -> None:
    pytest.importorskip("jax")
    pytest.importorskip("networkx")
    frontend = FRONTENDS.get("jax")
    spec = frontend.model_spec(JAX_FACTORY)
    assert isinstance(spec, OpaqueSpec) and spec.name == "gpt_step_factory"
    graph = frontend.graph(JAX_FACTORY, _job(spec, micro_batch=2, seq_len=16))
    assert graph.samples_per_micro_batch == 2 and graph.tokens_per_micro_batch == 32 and graph.num_ops > 0


def test_jax_refuses_a_split_and_a_bad_source() -> None:
    frontend = FRONTENDS.get("jax")
    with pytest.raises(ConfigError, match="factory"):
        frontend.model_spec("no_colon_here")
    spec = frontend.model_spec(JAX_FACTORY)
    cluster = load_cluster("local-cpu").with_num_gpus(2)
    for field, strategy in (("cp=2", {"cp": 2}), ("ep=2", {"ep": 2})):  # make_job refuses them; a Job by hand
        with pytest.raises(ConfigError, match=field):
            frontend.graph(JAX_FACTORY, Job(spec, cluster, ParallelSpec.model_validate({"dp": 1, **strategy})))
    # sp is taken: the capture is one device's whole step, the tree's configs and sp shape it afterwards
    whole = frontend.graph(JAX_FACTORY, Job(spec, cluster, ParallelSpec(tp=2, sp=True, dp=1, micro_batch=2,
                                                                         seq_len=16)))
    assert whole.tokens_per_micro_batch == 32
    with pytest.raises(ConfigError, match="cp=2"):
        _job(spec, 2, cp=2)


def test_an_opaque_model_takes_tp_for_a_tree_to_split() -> None:
    """make_job lets tp through for an opaque model (a captured graph: a strategy tree's configs split its ops,
    compile.shape_front_end); the JAX graph at tp 2 is the whole step, tagged for that pass."""
    pytest.importorskip("jax")
    pytest.importorskip("networkx")
    frontend = FRONTENDS.get("jax")
    spec = frontend.model_spec(JAX_FACTORY)
    whole = frontend.graph(JAX_FACTORY, _job(spec, micro_batch=2, seq_len=16))
    split = frontend.graph(JAX_FACTORY, _job(spec, 2, tp=2, micro_batch=2, seq_len=16))
    assert split.frontend == whole.frontend == "jax" and split.total_flops("fwd") == whole.total_flops("fwd")


# ---- torch ------------------------------------------------------------------------------------------------------
def test_torch_spec_of_a_hugging_face_config_is_the_catalogs(tmp_path: Path) -> None:
    path = _config(tmp_path, LLAMA_8B)
    spec = FRONTENDS.get("torch").model_spec(str(path))
    catalog = load_model("llama3.1-8b")
    assert isinstance(spec, TransformerSpec) and isinstance(catalog, TransformerSpec)
    fields = ("num_layers", "hidden", "ffn_hidden", "num_heads", "kv_heads", "vocab", "mlp", "norm", "position")
    assert [getattr(spec, f) for f in fields] == [getattr(catalog, f) for f in fields]


def test_torch_llama_config_agrees_with_the_catalog_within_1_percent(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cluster = load_cluster("dgx-h100-80gb")  # one node, 8 GPUs: tp=1, dp=8
    predicted = {}
    for name, source in (("catalog", "llama3.1-8b"), ("torch", str(_config(tmp_path, LLAMA_8B)))):
        frontend = FRONTENDS.get(name)
        job = make_job(frontend.model_spec(source), cluster, ParallelSpec(micro_batch=1, seq_len=2048))
        predicted[name] = predict_iteration_s(job, frontend.graph(source, job))
    assert predicted["torch"] == pytest.approx(predicted["catalog"], rel=0.01)


def test_torch_fused_graph_keeps_flops_and_fuses_projections(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = str(_config(tmp_path, TINY_LLAMA))
    frontend = FRONTENDS.get("torch")
    spec = frontend.model_spec(path)
    job = _job(spec, micro_batch=2, seq_len=64, attention="flash3")
    graph = frontend.graph(path, job)
    catalog = build_graph(spec, DeviceSlice.of(job.parallel))
    for phase in ("fwd", "bwd"):
        assert graph.total_flops(phase) == pytest.approx(catalog.total_flops(phase), rel=0.01)
    block = next(layer for layer in graph.layers if layer.kind == "block")
    gemms = [op.shape for op in block.fwd if op.kind == "matmul"]
    assert gemms == [(1, 128, 256, 128), (1, 128, 128, 128), (1, 128, 704, 128), (1, 128, 128, 352)]
    assert {op.kernel for op in block.fwd + block.bwd if op.kind == "attention"} == {"flash3"}
    assert block.count == 2 and graph.param_count() == catalog.param_count()


@pytest.mark.parametrize(("strategy", "field"), [({"attention": "math"}, "attention='math'")])
def test_torch_refuses_what_it_cannot_split(tmp_path: Path, strategy: dict[str, object], field: str) -> None:
    path = str(_config(tmp_path, TINY_LLAMA))
    spec = FRONTENDS.get("torch").model_spec(path)
    with pytest.raises(ConfigError, match=field):
        FRONTENDS.get("torch").graph(path, _job(spec, 2 if "attention" not in strategy else 1, seq_len=64,
                                                **strategy))


def test_torch_graph_at_tp_2_is_the_whole_model(tmp_path: Path) -> None:
    """tp > 1 captures one device's whole model (OpGraph.frontend "torch"): a strategy tree's configs over tp
    shape it (compile.shape_front_end; without one the compiler refuses)."""
    path = str(_config(tmp_path, TINY_LLAMA))
    frontend = FRONTENDS.get("torch")
    spec = frontend.model_spec(path)
    whole = frontend.graph(path, _job(spec, 1, seq_len=64))
    split = frontend.graph(path, _job(spec, 2, seq_len=64, tp=2))
    assert split.frontend == "torch" and split.total_flops("fwd") == whole.total_flops("fwd")
    # sequence and context parallelism are shaped by the compiler too (compile.front_end_sequence,
    # compile.front_end_context): the same graph
    for strategy in ({"tp": 2, "sp": True}, {"cp": 2}):
        assert frontend.graph(path, _job(spec, 2, seq_len=64, **strategy)).total_flops("fwd") == whole.total_flops(
            "fwd")


def test_torch_refuses_a_cnn() -> None:
    with pytest.raises(ConfigError, match="resnet50"):
        FRONTENDS.get("torch").model_spec("resnet50")


FACTORY = '''
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(32, 32) for _ in range(3)))

    def forward(self, x):
        return self.layers(x)


def make(micro_batch, seq_len):
    return Mlp(), [(micro_batch, seq_len, 32)]


def make_llama():
    import transformers
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
'''


def test_torch_factory_modules(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    source = tmp_path / "models.py"
    config = {k: v for k, v in TINY_LLAMA.items() if k not in ("model_type", "_name_or_path")}
    source.write_text(FACTORY + f"\nCONFIG = {config!r}\n")
    frontend = FRONTENDS.get("torch")
    mlp = frontend.model_spec(f"{source}:make")
    assert isinstance(mlp, OpaqueSpec) and mlp.name == "make"  # no config: opaque (dp, pp; tp by a tree)
    graph = frontend.graph(f"{source}:make", _job(mlp, micro_batch=4, seq_len=8))
    assert graph.param_count() == 3 * (32 * 32 + 32) and graph.total_flops("fwd") >= 3 * 2.0 * 32 * 32 * 32
    llama = frontend.model_spec(f"{source}:make_llama")
    assert isinstance(llama, TransformerSpec) and (llama.hidden, llama.num_layers) == (128, 2)
    with pytest.raises(ConfigError, match="no callable"):
        frontend.model_spec(f"{source}:nothing")
