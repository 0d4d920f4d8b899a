.DEFAULT_GOAL := help
PY ?= python3

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install:  ## install trainsim with the development tools
	$(PY) -m pip install -e '.[dev]'

test:  ## run the test suite
	$(PY) -m pytest -q

lint:  ## ruff and pyright
	ruff check src tests benchmarks scripts
	pyright

calibrate:  ## refit the package's cost models on its measurements (rewrites catalog/data/calibration/fitted.yaml)
	trainsim calibrate --update-package

crossval:  ## k-fold, leave-one-source-out and scale-extrapolation MAPE, and the bands' coverage
	trainsim calibrate --cross-validate

sync-data:  ## copy ../shared/data/calibration into the package (catalog/data/measurements)
	$(PY) scripts/sync_calibration_data.py

validate:  ## predict every calibration run and print the MAPE per source and metric
	trainsim validate src/trainsim/catalog/data/measurements/runs.csv --no-rows

fuzz:  ## the long fuzz run: 10,000 seeded broken inputs, counted by outcome (tests/fuzz runs 150 in CI)
	$(PY) benchmarks/fuzz.py --examples 10000 --seed 12

bench:  ## speed figures (plans per second of the search)
	$(PY) benchmarks/bench_search.py

ci:  ## what CI runs
	bash .ci/run
