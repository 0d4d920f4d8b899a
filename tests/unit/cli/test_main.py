"""The `trainsim` process entry (cli.main.main) against the in-process one (command_line): same output, and the
start-up tuning (garbage collector paused while loading, frozen after; pydantic plugins off) only in the first."""

import gc
import json
import os
import subprocess
import sys

import pytest

from trainsim.cli.main import command_line

# Runs `trainsim predict` through the named entry, recording at the command's start whether the collector runs,
# how many objects are frozen and the plugin setting pydantic reads; prints the record after the command's output.
PROBE = """
import gc, json, os, sys
import trainsim.api.prediction as prediction
import trainsim.api as api

seen = {}
def predict(*args, **kwargs):
    seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(),
                plugins=os.environ.get("PYDANTIC_DISABLE_PLUGINS"))
    return prediction.predict(*args, **kwargs)

api.predict = predict
from trainsim.cli.main import ENTRY as entry
sys.argv = ["trainsim", "predict", "--json", "--tp", "2"]
try:
    entry()
finally:
    print(json.dumps(seen))
"""


def _run(entry: str, env_extra: dict[str, str] | None = None) -> tuple[dict, dict]:
    env = {key: value for key, value in os.environ.items() if key != "PYDANTIC_DISABLE_PLUGINS"}
    env.update(env_extra or {})
    script = PROBE.replace("ENTRY as entry", f"{entry} as entry")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    *output, seen = proc.stdout.strip().splitlines()
    return json.loads("\n".join(output)), json.loads(seen)


def test_process_entry_prints_what_the_in_process_entry_prints() -> None:
    process, process_seen = _run("main")
    in_process, in_process_seen = _run("command_line")
    assert process == in_process  # every key and number of the prediction
    # main: the command runs with the collector on, the start-up objects frozen, pydantic's plugins off
    assert process_seen["enabled"] is True and process_seen["frozen"] > 10_000
    assert process_seen["plugins"] == "__all__"
    # command_line: the collector and the environment as the caller had them
    assert in_process_seen == {"enabled": True, "frozen": 0, "plugins": None}


def test_process_entry_keeps_the_environments_plugin_setting() -> None:
    _, seen = _run("main", {"PYDANTIC_DISABLE_PLUGINS": ""})  # empty: load every plugin
    assert seen["plugins"] == ""


@pytest.mark.parametrize("enabled", [True, False])
def test_command_line_leaves_the_collector_as_it_was(enabled: bool, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    frozen = gc.get_freeze_count()
    monkeypatch.setattr(sys, "argv", ["trainsim", "predict", "--json"])
    if not enabled:
        gc.disable()
    try:
        with pytest.raises(SystemExit) as exit_info:
            command_line()
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert exit_info.value.code == 0
    assert gc.get_freeze_count() == frozen
    assert json.loads(capsys.readouterr().out)["engine"] == "analytical"
