"""Costs of ops (compute) in seconds."""
