"""For every test: vLLM (`make vllm`, ``.venv-vllm``) is looked for only by the tests that ask for
it (tests/conspo/test_vllm_engine.py, through CONSPO_TEST_VLLM_PYTHON): elsewhere the platform
behaves as on a machine without it, whatever this checkout holds, so the refusals the API tests
assert do not depend on whether someone ran `make vllm` here."""

import os

# What the vLLM tests use: the interpreter set for them, else the platform's own search. Kept in
# the environment (not a module global): pytest may import this file twice.
os.environ.setdefault("CONSPO_TEST_VLLM_PYTHON", os.environ.get("CONSPO_VLLM_PYTHON", ""))
os.environ["CONSPO_VLLM_PYTHON"] = "none"

# One OpenMP thread per process the tests start (servers' embedded workers, Celery workers, CLI
# runs), as tests/conspo already runs its own models: two pytest-xdist workers fill both cores,
# and two-thread processes beside each other spin and yield in the kernel (~40% of CPU time seen
# on an oversubscribed box) instead of computing. Set before torch is imported; a caller's own
# OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
