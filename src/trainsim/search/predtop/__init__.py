"""PredTOP (Ahmed et al., "PredTOP: latency prediction for distributed DL training with operator parallelism"):
a stage's DAG of tensor operations (dag.py), a DAG Transformer with GCN and GAT baselines predicting the
stage's latency per mesh and intra plan (models.py), their training and evaluation (train.py), and the
stage cost source the planners use (costs.py). Torch is imported by those modules, not by this package."""
