"""Estimators of the fidelity ladder; each returns a Result."""
