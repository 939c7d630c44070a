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
# The web UI: TypeScript in web/, built by npm into the package (generated, never committed).
WEB_OUT := src/perfsight/server/static/index.html
WEB_DEPS := web/node_modules/.package-lock.json
WEB_SRC := $(shell find web/src web/public -type f 2>/dev/null) web/index.html web/vite.config.ts web/tsconfig.json

.PHONY: demo test lint bench clean web

# `.venv` is the directory; its freshness is the stamp's.
$(VENV): $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install '$(TORCH_REQ)'
	$(BIN)/python -m pip install -e '.[torch,dev]'
	touch $@

# A fresh run each time: a second trace in the same folder would be analysed as another rank.
demo: $(STAMP) $(WEB_OUT)
	rm -rf demo_output
	$(BIN)/python examples/train_ddp.py --out demo_output/run --world-size 4
	$(BIN)/perfsight analyse demo_output/run --out demo_output/analysis
	$(BIN)/python examples/train_pp.py --out demo_output/pp --stages 2 --overload-stage 1
	$(BIN)/perfsight analyse demo_output/pp --out demo_output/pp_analysis
	@echo 'make demo: browse the runs at http://127.0.0.1:8080/ (Ctrl-C stops the server)'
	$(BIN)/perfsight serve --summary-base-dir demo_output

# pytest exits 5 when it collected no tests; that is a failure here, with a message saying so.
test: $(STAMP) $(WEB_OUT)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/python -m pytest -n 2 --timeout 900; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo 'make test: pytest collected no tests' >&2; exit 1; fi; \
	exit $$rc

web: $(WEB_OUT)

$(WEB_DEPS): web/package.json web/package-lock.json
	@command -v npm >/dev/null || { echo 'make web: npm not found; install Node.js >= 18 with npm (Debian: apt-get install nodejs npm)' >&2; exit 1; }
	# `npm install`, not `npm ci`: the lock holds only the platform packages (rollup, esbuild) the
	# registry served when it was written, and `npm ci` rejects a lock missing any optional one.
	cd web && npm install --no-audit --no-fund
	touch $@

$(WEB_OUT): $(WEB_DEPS) $(WEB_SRC)
	cd web && npm run build
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)

# e.g. make bench BENCH_ARGS='--big --write-md docs/BENCHMARKS.md'
bench: $(STAMP)
	$(BIN)/python -m pip install -e '.[bench]'
	$(BIN)/python benchmarks/bench_vs_hta.py $(BENCH_ARGS)

clean:
	rm -rf demo_output build dist .pytest_cache .ruff_cache src/perfsight/server/static
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
