"""`trainsim profile`: what the op and collective microbenchmarks added to the profile database."""

from pathlib import Path
from typing import Any

from trainsim.profile.collectives import CollectiveSummary
from trainsim.profile.database import Environment
from trainsim.profile.ops import OpProfileSummary
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.units import format_duration

LOCAL_CPU_DEVICE = "cpu-local"  # the device name this machine's CPU times are filed under


def profile_summary(db_path: Path, env: Environment, model_name: str, shape: DeviceSlice,
                    ops: OpProfileSummary | None, comms: CollectiveSummary | None, op_rows: int,
                    collective_rows: int) -> dict[str, Any]:
    """The --json object: where and what was profiled, how much was measured or already stored, and how many
    measurements the database holds now."""
    return {
        "db": str(db_path), "device": env.device, "hardware": env.hardware, "versions": env.versions,
        "threads": env.threads, "model": model_name, "precision": shape.precision.name,
        "micro_batch": shape.micro_batch, "seq_len": shape.seq_len, "tp": shape.tp,
        "signatures": ops.signatures if ops else 0,
        "measured": (ops.measured if ops else 0) + (comms.measured if comms else 0),
        "ops_measured": ops.measured if ops else 0, "ops_already_stored": ops.already_stored if ops else 0,
        "unsupported_ops": list(ops.unsupported) if ops else [],
        "collectives_measured": comms.measured if comms else 0,
        "collectives_already_stored": comms.already_stored if comms else 0,
        "collectives_failure": comms.failure if comms else "",
        "op_rows": op_rows, "collective_rows": collective_rows,
    }


def render_profile_summary(summary: dict[str, Any], duration_s: float) -> str:
    """The summary as lines of text, with what took `duration_s`."""
    lines = [f"profile database {summary['db']}",
             f"  device {summary['device']} ({summary['hardware']}), {summary['versions']}, "
             f"{summary['threads']} threads",
             f"  {summary['model']} {summary['precision']} mb={summary['micro_batch']} seq={summary['seq_len']} "
             f"tp={summary['tp']}: {summary['signatures']} op signatures, {summary['ops_measured']} measured, "
             f"{summary['ops_already_stored']} already stored",
             f"  collectives: {summary['collectives_measured']} measured, "
             f"{summary['collectives_already_stored']} already stored",
             f"  database holds {summary['op_rows']} op and {summary['collective_rows']} collective measurements; "
             f"took {format_duration(duration_s)}"]
    if summary["unsupported_ops"]:
        lines.append("  no microbenchmark (the roofline answers): " + ", ".join(summary["unsupported_ops"]))
    if summary["collectives_failure"]:
        lines.append(f"  collectives stopped early: {summary['collectives_failure']} (rerun to resume)")
    if summary["device"] != LOCAL_CPU_DEVICE:
        lines.append(f"  predictions use these times for clusters whose device is named {summary['device']!r}")
    return "\n".join(lines)
