# kvgate developer commands. `make demo` and `make test` are the two that matter first.
VENV ?= .venv
PY := $(VENV)/bin/python
KVGATE := $(VENV)/bin/kvgate

.PHONY: install demo test test-unit test-integration test-e2e lint crds bench helm \
        cluster-build cluster-up cluster-down kind-e2e clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,peers]'  # dev includes every component's extra
	touch $@

install: $(VENV)/.installed

demo: install
	$(KVGATE) demo

lint: install
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test-unit: install
	$(PY) -m pytest tests/unit -q

test-integration: install
	$(PY) -m pytest tests/integration -q -m integration

test-e2e: install cluster-build
	$(PY) -m pytest tests/e2e -q -m e2e

# The README's test command: lint, then every test (unit, integration, e2e).
test: install
	$(MAKE) lint
	$(PY) -m pytest -q

# The pinned Helm the chart tests use (tests/unit/chart/helm_tool.py), linked as .venv/bin/helm.
helm: install
	ln -sf "$$($(PY) -m tests.unit.chart.helm_tool)" $(VENV)/bin/helm
	$(VENV)/bin/helm version --short

crds: install
	$(KVGATE) crds --out crds --docs docs/crds.md

cluster-build:
	bash hack/cluster/build.sh

cluster-up: cluster-build
	bash hack/cluster/up.sh

cluster-down:
	bash hack/cluster/down.sh

# Benchmarks print numbers (pytest-benchmark); they are not part of `make test`.
bench: install
	$(PY) -m pytest benchmarks -q --benchmark-only -p no:cacheprovider

kind-e2e: install
	bash hack/kind-e2e.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .cache
