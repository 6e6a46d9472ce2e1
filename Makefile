# Switchyard: `make run` starts the local stack on mock engines, `make test` runs every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test unit e2e lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/switchyard up --mock-engines sglang,vllm --http-port 8000

test: $(STAMP)
	$(BIN)/pytest -q

unit: $(STAMP)
	$(BIN)/pytest -q libs services

e2e: $(STAMP)
	$(BIN)/pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy libs/common services/router services/dispatcher protos

clean:
	rm -rf $(VENV) build *.egg-info

bench: $(STAMP)
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	$(BIN)/python bench/baseline.py
	$(BIN)/python bench/kv_routing.py
	$(BIN)/python bench/kv_conversations.py $(if $(BASELINE_PYTHON),--baseline-python $(BASELINE_PYTHON))
	$(BIN)/python bench/kv_ingest.py
	$(BIN)/python bench/route_decision.py
	$(BIN)/python bench/load.py --with-smg
	$(BIN)/python bench/long_prompts.py
	$(BIN)/python bench/faults.py
	$(BIN)/python bench/disagg.py
