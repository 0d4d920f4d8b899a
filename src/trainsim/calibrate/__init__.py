"""The fits behind catalog/data/calibration/fitted.yaml (`trainsim calibrate`): GEMM and collective
microbenchmarks (microbenchmarks.py), run-level and simulator parameters on runs.csv (runs.py), and the whole
fit with its cross-validation (fit.py)."""
