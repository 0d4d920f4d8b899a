"""Compile passes: Job (+ OpGraph, strategy) -> ExecGraph of per-device tasks for the simulator."""
