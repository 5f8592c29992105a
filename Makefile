# Two entry points for a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test bench clean

$(BIN)/fleetplan: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,pyomo,ortools,profile-cpu,plot]'
	touch $(BIN)/fleetplan

install: $(BIN)/fleetplan

run: install
	@echo "Serving on http://$(HOST):$(PORT) (OpenAPI at /schema). In another shell:"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/plan -H 'content-type: application/json' --data @fixtures/requests/paper.json"
	$(BIN)/fleetplan serve --host $(HOST) --port $(PORT)

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/solver_scaling.py
	$(BIN)/python bench/http_latency.py
	$(BIN)/python bench/simulate_speed.py
	$(BIN)/python bench/headroom_sweep.py

clean:
	rm -rf $(VENV) build *.egg-info
