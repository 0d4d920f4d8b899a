"""Validation against measured runs, metrics, and the calibration fit."""
