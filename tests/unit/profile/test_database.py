"""The profile database and `trainsim profile`: storage, signatures, and the interrupted-run contract (issue 4:
killing `trainsim profile` midway and running it again measures only what was missing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import PROFILE_ENV, TINY_GPT
from trainsim.catalog.model_files import parse_model
from trainsim.errors import InputFileError
from trainsim.profile.database import (
    STOP_AFTER_ENV,
    STOP_EXIT_CODE,
    Environment,
    OpSignature,
    ProfileDB,
    default_db_path,
)
from trainsim.profile.framework import frameworks_for
from trainsim.profile.job import job_graph
from trainsim.profile.ops import signature_of, unique_signatures
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for

SIG = OpSignature("matmul", "mm", "fwd", "fp32", (1, 8, 16, 32))


def test_samples_merge_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        assert db.op_repeats(PROFILE_ENV, SIG) == 0
        db.add_op_samples(PROFILE_ENV, SIG, [3.0, 1.0], "first")
        stats = db.add_op_samples(PROFILE_ENV, SIG, [2.0], "second")
        assert db.op_repeats(PROFILE_ENV, SIG) == 3
        assert stats.median_s == 2.0 and stats.repeats == 3
        assert stats.p10_s < 2.0 < stats.p90_s
    with ProfileDB.open_read_only(path) as db:
        (row,) = list(db.op_rows("cpu-local"))
    assert row.signature == SIG and row.env == PROFILE_ENV and row.detail == "second"
    assert list(ProfileDB.open_read_only(path).op_rows("other-device")) == []


def test_environments_are_kept_apart(tmp_path: Path) -> None:
    with ProfileDB.open(tmp_path / "p.sqlite") as db:
        db.add_op_samples(PROFILE_ENV, SIG, [1.0])
        other_threads = Environment("cpu-local", "torch test", 2, "test cpu")
        assert db.op_repeats(other_threads, SIG) == 0
        db.add_op_samples(other_threads, SIG, [0.5])
        assert db.count() == 2


def test_missing_database_is_a_one_line_error_with_a_remedy(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="trainsim profile"):
        ProfileDB.open_read_only(tmp_path / "absent.sqlite")


def test_default_path_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "trainsim" / "profile.sqlite"


def test_every_op_of_a_transformer_has_a_signature() -> None:
    model = parse_model(TINY_GPT)
    for precision in ("fp32", "amp-bf16", "bf16"):
        graph = job_graph(model, DeviceSlice(2, 16, policy_for(precision)))
        signatures, unsupported = unique_signatures(graph)
        assert not unsupported
        # forward and backward of each distinct op, duplicates shared (e.g. residual adds of equal size)
        assert len(signatures) < sum(len(layer.fwd) + len(layer.bwd) for layer in graph.layers)
        impls = {sig.impl for sig in signatures}
        assert {"mm", "mm.dgrad", "mm.wgrad", "sdpa.causal", "norm", "gelu", "add", "cross_entropy",
                "embedding", "mm.logits"} <= impls


def test_signatures_follow_shapes_and_dtypes() -> None:
    model = parse_model(TINY_GPT)
    fp32 = job_graph(model, DeviceSlice(2, 16, policy_for("fp32")))
    bf16 = job_graph(model, DeviceSlice(2, 16, policy_for("amp-bf16")))
    qkv32, qkv16 = (next(op for op in g.layers[1].fwd if op.name == "qkv") for g in (fp32, bf16))
    assert signature_of(qkv32) == OpSignature("matmul", "mm", "fwd", "fp32", (1, 32, 96, 32))
    assert signature_of(qkv16) == OpSignature("matmul", "mm", "fwd", "bf16", (1, 32, 96, 32))
    tp2 = job_graph(model, DeviceSlice(2, 16, policy_for("fp32"), tp=2))
    qkv_tp = next(op for op in tp2.layers[1].fwd if op.name == "qkv")
    assert signature_of(qkv_tp) == OpSignature("matmul", "mm", "fwd", "fp32", (1, 32, 48, 32))


def test_the_zero_stage_changes_no_op_signature_only_the_framework_overhead_profiled() -> None:
    model = parse_model(TINY_GPT)
    plain, sharded = DeviceSlice(2, 16, policy_for("fp32")), DeviceSlice(2, 16, policy_for("fp32"), zero=3)
    assert unique_signatures(job_graph(model, plain)) == unique_signatures(job_graph(model, sharded))
    assert DeviceSlice.of(ParallelSpec(zero=3, micro_batch=2, seq_len=16, precision="fp32")).zero == 3
    assert plain == sharded  # one OpGraph (and graph-cache entry) for every ZeRO stage
    assert frameworks_for(plain.tp, plain.sp, plain.zero) == []
    assert frameworks_for(sharded.tp, sharded.sp, sharded.zero) == ["fsdp2-zero3"]


def _profile(db: Path, model_file: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from trainsim.cli.main import main; main()", "profile",
               "--model", str(model_file), "--precision", "fp32", "--micro-batch", "1", "--seq-len", "8",
               "--db", str(db), "--device", "cpu", "--threads", "1", "--warmup", "0", "--repeats", "1",
               "--no-collectives", "--no-optimizer", "--json"]
    full_env = {key: value for key, value in os.environ.items() if key != STOP_AFTER_ENV}
    full_env.update(env or {})
    return subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=300, check=False)


def test_killed_profile_resumes_without_measuring_again(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model_file = tmp_path / "tiny.yaml"
    model_file.write_text(yaml.safe_dump(TINY_GPT))
    db = tmp_path / "profile.sqlite"

    killed = _profile(db, model_file, {STOP_AFTER_ENV: "5"})
    assert killed.returncode == STOP_EXIT_CODE, killed.stderr
    with ProfileDB.open_read_only(db) as handle:
        assert handle.count() == 5  # every measurement taken before the kill is stored

    resumed = _profile(db, model_file)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    total = summary["signatures"]
    assert summary["ops_already_stored"] == 5
    assert summary["measured"] == summary["ops_measured"] == total - 5
    assert summary["op_rows"] == total

    again = json.loads(_profile(db, model_file).stdout)
    assert again["measured"] == 0 and again["ops_already_stored"] == total and again["op_rows"] == total


def test_collectives_run_on_two_local_processes_and_resume(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from trainsim.profile.collectives import profile_collectives

    with ProfileDB.open(tmp_path / "c.sqlite") as db:
        first = profile_collectives(db, PROFILE_ENV, collectives=("all-reduce", "all-gather", "send-recv"),
                                    sizes=(4096,), warmup=1, repeats=2, timeout_s=120)
        assert first.failure == "" and first.measured == 3
        rows = {row.collective: row for row in db.collective_rows("cpu-local")}
        assert set(rows) == {"all-reduce", "all-gather", "send-recv"}
        assert all(row.stats.median_s > 0 and row.world_size == 2 for row in rows.values())
        second = profile_collectives(db, PROFILE_ENV, collectives=("all-reduce",), sizes=(4096,), timeout_s=120)
        assert second.measured == 0 and second.already_stored == 1
