"""The event-driven simulator: runs an ExecGraph with streams, overlap, bandwidth sharing and memory."""

from trainsim.sim.engine import DeadlockError, Engine, simulate
from trainsim.sim.outcome import DeviceMemory, SimOptions, SimOutcome, busy_s_by_device

__all__ = ["DeadlockError", "DeviceMemory", "Engine", "SimOptions", "SimOutcome", "busy_s_by_device", "simulate"]
