"""The execution-trace front-end: PyTorch execution traces and their Kineto traces, per rank (rank_trace.py:
the trace IR; parse.py, kineto.py: reading; to_op_graph.py: one rank as an OpGraph; to_exec_graph.py and
measured.py: every rank as the measured ExecGraph that trace replay reads); frontend.py is its registry entry."""
