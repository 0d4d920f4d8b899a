"""Rendering results: text tables and JSON."""
