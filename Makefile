# Two entry points for a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test dist-check bench clean

$(BIN)/fleetplan: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,pyomo,ortools,profile-cpu,plot,postgres,dask,forecast]'
	touch $(BIN)/fleetplan

install: $(BIN)/fleetplan

run: install
	@echo "Serving on http://$(HOST):$(PORT) (OpenAPI at /schema). In another shell:"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/plan -H 'content-type: application/json' --data @fleetplan/fixtures/requests/paper.json"
	$(BIN)/fleetplan serve --host $(HOST) --port $(PORT)

# lint is part of the tests: ruff check (complexity rules on) and ruff format --check, then pytest on every
# core (pytest-xdist), then alone the few tests that measure real CPU timings (marker `serial`)
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n auto -m "not serial"
	$(BIN)/python -m pytest -m serial

# Build the sdist and wheel, install the wheel in a fresh venv outside the checkout, plan and serve from it
dist-check: install
	$(BIN)/python scripts/check_dist.py

bench: install
	$(BIN)/python -m bench.solver_scaling
	$(BIN)/python -m bench.http_latency
	$(BIN)/python -m bench.simulate_speed
	$(BIN)/python -m bench.headroom_sweep

clean:
	rm -rf $(VENV) build dist *.egg-info
