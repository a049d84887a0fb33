# Two commands on a fresh machine:  make demo   (the main job)   and   make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned on every pip call so a dependency can never pull a multi-GB CUDA build here.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q $(TORCH_PIN) -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/areal-nb demo

test: install
	$(BIN)/python -m pytest -x -q tests

bench: install
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache
