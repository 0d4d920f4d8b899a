"""Real distributed runs of a job: ground truth for the estimators (`trainsim measure`, docs/measure.md).

model.py builds the job's transformer in PyTorch, parallelize.py applies its strategy with PyTorch's parallel
APIs, worker.py is the per-rank training loop (also started by torchrun), launch.py starts and watches the
ranks on this machine, results.py saves and loads measured runs, suite.py holds the local ground-truth suite.
Only model.py, parallelize.py and worker.py import torch.
"""
