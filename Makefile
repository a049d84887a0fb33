# Two commands on a fresh machine:  make demo   (the main job)   and   make test
# While working:  make test-fast  (unit tests only: no servers, no training, no browser, no notebooks)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned on every pip call so a dependency can never pull a multi-GB CUDA build here.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo demo-tools test test-fast bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q $(TORCH_PIN) -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/areal-nb demo

# The tool-using task (issue 17): tiny-tools learns to call the calculator and copy its result.
demo-tools: install
	$(BIN)/areal-nb demo --config configs/tool_use.yaml --out runs/tool_use

# Everything, as CI runs it: unit tests, real servers, training, notebooks, the browser test,
# and the import-linter layer contracts (tests/test_layers.py). -rs prints why a test skipped.
test: install
	$(BIN)/python -m pytest -x -q -rs tests

# The unit tests (about a minute): the markers are declared in pyproject.toml, and
# tests/conftest.py fails an unmarked test that starts a server.
test-fast: install
	$(BIN)/python -m pytest -x -q -rs -m "not slow and not server and not browser" tests

bench: install
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache
