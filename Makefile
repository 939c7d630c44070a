# perfsight developer tasks.  `make demo` and `make test` are the two you need.
#
# The virtual environment is built once and rebuilt when pyproject.toml changes.  torch is pinned
# and installed *before* the package: `pip install torch==2.13.0` resolves to a local CPU build,
# while the `torch` extra's open range would otherwise let pip fetch a multi-GB CUDA build.

PY ?= python3
VENV ?= .venv
TORCH_REQ ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.perfsight-installed
LINT_PATHS := src tests benchmarks examples
BENCH_ARGS ?=

.PHONY: demo test lint bench clean

# `.venv` is the directory; its freshness is the stamp's.
$(VENV): $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install '$(TORCH_REQ)'
	$(BIN)/python -m pip install -e '.[torch,dev]'
	touch $@

# A fresh run each time: a second trace in the same folder would be analysed as another rank.
demo: $(STAMP)
	rm -rf demo_output
	$(BIN)/python examples/train_mlp.py --out demo_output/run
	$(BIN)/perfsight analyse demo_output/run --out demo_output/analysis

# pytest exits 5 when it collected no tests; that is a failure here, with a message saying so.
test: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/python -m pytest -n 2 --timeout 900; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo 'make test: pytest collected no tests' >&2; exit 1; fi; \
	exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)

# e.g. make bench BENCH_ARGS='--big --write-md docs/BENCHMARKS.md'
bench: $(STAMP)
	$(BIN)/python -m pip install -e '.[bench]'
	$(BIN)/python benchmarks/bench_vs_hta.py $(BENCH_ARGS)

clean:
	rm -rf demo_output build dist .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
