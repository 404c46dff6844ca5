# Each target creates or refreshes the project's own virtual environment first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean stack

# The core is compiled into the source tree (setup.py): a change to it rebuilds.
CORE := $(wildcard analysim/core/*.py analysim/core/plugins/*.py)

$(STAMP): pyproject.toml setup.py $(CORE)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/analysim up --out out/demo --plots

# deploy/compose.yaml's services as local processes (no container runtime), with Prometheus
# when it is installed; prints every endpoint; Ctrl-C stops it all.
stack: $(STAMP)
	$(BIN)/python deploy/local_stack.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --durations=15

lint: $(STAMP)
	$(BIN)/ruff check .

# Measure BENCHMARKS.md's current tables again on this machine (every area, about 15 minutes;
# needs ../shared; one area: .venv/bin/python bench/current.py --area NAME). Run it quiet.
bench: $(STAMP)
	$(BIN)/python bench/current.py

# Rewrite tests/golden/digests.json (golden schedules) after an intended schedule change; say
# in the commit message why the schedule changed.
.PHONY: golden
golden: $(STAMP)
	$(BIN)/python -m tests.golden_runs

# Rewrite the sample outputs the docs show (README's sweep table, ...) from the commands that print
# them (tests/docs_blocks.py; needs ../shared); tests/test_docs.py fails while one is stale. Run it
# after a change that changes schedules, and commit the result.
.PHONY: docs-samples
docs-samples: $(STAMP)
	$(BIN)/python -m tests.docs_blocks

# dist/: the pure-Python wheel (py3-none-any: any Python >= 3.11 and platform, no compiler), the
# sdist (compiles the core at install where mypy and a C compiler are, as a checkout does), and the
# compiled wheel (this machine's Python and platform only: linux_x86_64 is not for PyPI).
# dist-pure: the first two only (what to hand to others or upload; nothing compiled).
.PHONY: dist dist-pure
dist: dist-pure
	$(BIN)/python -m pip wheel --no-deps -w dist .

dist-pure: $(STAMP)
	rm -rf build  # an earlier build's files would go into these
	ANALYSIM_PURE_PYTHON=1 $(BIN)/python -m pip wheel --no-deps --no-build-isolation -w dist .
	ANALYSIM_PURE_PYTHON=1 $(BIN)/python -c "from setuptools import build_meta as b; b.build_sdist('dist')"

clean:
	rm -rf $(VENV) out build dist *.egg-info .pytest_cache .ruff_cache *.so analysim/core/*.so analysim/core/plugins/*.so

# Regenerate the Python gRPC code for every protos/**/*.proto (committed; a test fails when stale).
.PHONY: protos protos-baseline
protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

# Record the contracts as the baseline `buf breaking` compares against (tests/test_protos_buf.py).
# Only after a reviewed, intended contract change.
protos-baseline: $(STAMP)
	$(BIN)/buf build --exclude-source-info -o protos/baseline.binpb
