"""Rendering every command's output: pure functions from computed data to text or to a JSON-able dict.

text.py, explain.py and trace.py render `predict` (a Result, its critical path, its Chrome trace); search.py,
validate.py, measure.py, graph.py, profile.py and catalog.py render the other commands; rich_text.py turns rich
tables into the string a command prints.
"""
