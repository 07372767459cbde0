# Two commands matter: `make run` and `make test`. Both set up everything they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SYSSTAMP := $(VENV)/.sysdeps
CONSOLE  := src/agentic_sandbox/controller/console/build/manifest.json

export AIWG_STATE_DIR ?= $(CURDIR)/.run

.PHONY: run cluster test lint typecheck bench install sysdeps venv console clean docs

$(PY):
	bash scripts/install-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(SYSSTAMP): scripts/install-system-deps.sh | $(PY)
	bash scripts/install-system-deps.sh
	touch $@

$(STAMP): pyproject.toml agent/pyproject.toml $(SYSSTAMP) | $(PY)
	$(PY) -m pip install -q -e '.[test]' -e ./agent
	$(PY) -m pip install -q 'libvirt-python>=9' || echo "libvirt-python not installed: VM tests will be skipped" >&2
	touch $@

# The web console (src/agentic_sandbox/controller/console/build/): xterm.js from npm at the versions console/package-lock.json
# pins, plus the console's own files from console/src/ (see scripts/build-console.py).
$(CONSOLE): scripts/build-console.py console/package.json console/package-lock.json $(wildcard console/src/*) | $(SYSSTAMP)
	$(PYTHON) scripts/build-console.py

sysdeps: $(SYSSTAMP)
venv: $(STAMP)
console: $(CONSOLE)

run: $(STAMP) $(CONSOLE)
	$(PY) scripts/devrun.py

# make run with three controllers (ports 8122-8124) on a private PostgreSQL server: the shared store
# (docs/postgresql.md). Ctrl-C stops the controllers, hostd, then the database server.
cluster: $(STAMP) $(CONSOLE)
	$(PY) scripts/devcluster.py $(if $(HOSTS),--hosts $(HOSTS))

test: $(STAMP) $(CONSOLE)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check src agent tests bench scripts
	$(VENV)/bin/ruff format --check src agent tests bench scripts

# Settings in pyproject.toml ([tool.mypy]): strict for proto, checked bodies everywhere else.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# docs/configuration.md, rendered from the settings tables and the daemons' flags (a test fails
# while it is stale).
docs: $(STAMP)
	$(PY) scripts/gen-config-doc.py

bench: $(STAMP)
	@for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

install: $(STAMP)
	bash scripts/install-units.sh

clean:
	rm -rf $(VENV) .venv-a2a03 .run .pytest_cache console/node_modules src/agentic_sandbox/controller/console/build
