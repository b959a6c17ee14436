"""For every test: vLLM (`make vllm`, ``.venv-vllm``) is looked for only by the tests that ask for
it (tests/conspo/test_vllm_engine.py, through CONSPO_TEST_VLLM_PYTHON): elsewhere the platform
behaves as on a machine without it, whatever this checkout holds, so the refusals the API tests
assert do not depend on whether someone ran `make vllm` here."""

import os

import pytest

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


@pytest.hookimpl(trylast=True)  # after pytest's own ordering (by fixture parameters)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a ``slow`` test run first. ``make test`` hands pytest-xdist whole files
    (``--dist loadfile``) in this order (``--no-loadscope-reorder``; by default xdist orders files
    by their number of tests, which put the slow one-test files, a worker's minutes each, last):
    begun early, a long file overlaps the other worker's many short ones instead of holding one
    worker alone at the end of the run."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the order within stays
