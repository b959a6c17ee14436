"""The vLLM engine's own process: run by ``conspo.generation.vllm_engine`` with vLLM's interpreter.

    <vllm python> vllm_server.py <socket path>        (the key in CONSPO_VLLM_AUTHKEY, hex)

vLLM pins versions of transformers and fastapi that conflict with this library's, so it lives in
a virtualenv of its own (``make vllm``: ``.venv-vllm``) and this file is all that runs there: it
imports the standard library, torch and vllm, nothing of ``conspo``. It listens on a Unix socket
(``multiprocessing.connection``, authenticated with a per-engine key) for one client, the
trainer, and answers its requests one at a time:

    {"op": "start", "model": dir, "dtype": "bfloat16", "max_model_len": L, "kv_cache_bytes": B,
     "memory_fraction": f, "threads": t, "enforce_eager": bool}
    {"op": "generate", "prompts": [[ids]], "n": G, "temperature": T, "top_p": p,
     "max_tokens": M, "stop_token_ids": [ids], "stop": [strings] | None, "seed": s}
        -> {"rows": [[ids]] (prompt-major, G per prompt), "logprobs": [[float]]}
    {"op": "load_weights", "path": file.safetensors}     (the policy's merged weights)
    {"op": "close"}

Every answer is a dict; a failure is ``{"error": traceback}``, and the process goes on serving.
It exits when the trainer closes the connection or dies (a killed trainer leaves no engine
holding memory behind; the directory of its socket and weights goes at the next engine's start or
a worker's reaper pass, ``conspo.generation.shm_dirs``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Listener
from typing import Any

# Set before vllm is imported, which reads them once:
# - the engine core in this process, not a further child: sampling then draws from this
#   process's torch generator, which "generate" seeds (no per-request seeds: vLLM's CPU sampler
#   cannot seed a request whose prefill it splits);
# - OpenMP threads left where the trainer's are (the trainer waits while this samples), not
#   pinned to cores by vLLM's auto binding;
# - info logs off: warnings and errors still reach the run's log through stderr.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _watch_parent(parent: int) -> None:
    """Exit when the trainer is gone (it may be SIGKILLed: no close ever comes)."""
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(1.0)


class Server:
    def __init__(self) -> None:
        self.llm: Any = None

    def start(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        torch.set_num_threads(int(msg["threads"]))
        started = time.perf_counter()
        from vllm import LLM

        extra: dict[str, Any] = {}
        if msg.get("kv_cache_bytes"):
            extra["kv_cache_memory_bytes"] = int(msg["kv_cache_bytes"])
        self.llm = LLM(
            model=msg["model"],
            dtype=msg["dtype"],
            max_model_len=int(msg["max_model_len"]),
            gpu_memory_utilization=float(msg["memory_fraction"]),
            enforce_eager=bool(msg["enforce_eager"]),
            # the sampled tokens' log-probs under the distribution sampled from (after
            # temperature and top-p), the policy's, not the raw logits'
            logprobs_mode="processed_logprobs",
            seed=0,
            **extra,
        )
        import vllm

        return {
            "seconds": time.perf_counter() - started,
            "version": vllm.__version__,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
        }

    def generate(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch
        from vllm import SamplingParams

        greedy = float(msg["temperature"]) == 0
        params = SamplingParams(
            n=int(msg["n"]),
            temperature=float(msg["temperature"]),
            top_p=1.0 if greedy else float(msg["top_p"]),
            max_tokens=int(msg["max_tokens"]),
            stop_token_ids=list(msg["stop_token_ids"]),
            stop=msg.get("stop") or None,
            include_stop_str_in_output=True,
            ignore_eos=False,
            skip_special_tokens=False,
            detokenize=bool(msg.get("stop")),  # stop strings need the text; nothing else does
            logprobs=0,
        )
        torch.manual_seed(int(msg["seed"]))
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(int(msg["seed"]))
        prompts = [{"prompt_token_ids": list(ids)} for ids in msg["prompts"]]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        rows, logprobs = [], []
        for out in outputs:  # in the order of the prompts
            for done in sorted(out.outputs, key=lambda o: o.index):
                rows.append(list(done.token_ids))
                logprobs.append(
                    [
                        entry[token].logprob
                        for token, entry in zip(done.token_ids, done.logprobs or [], strict=False)
                    ]
                )
        return {"rows": rows, "logprobs": logprobs}

    def load_weights(self, msg: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import load_file

        started = time.perf_counter()
        weights = load_file(msg["path"])
        # In checkpoint format: vLLM's own load_weights maps them onto its fused layers (qkv,
        # gate_up); the CPU model's parameters have no weight_loader for a direct copy.
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(weights.items()), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
        return {"seconds": time.perf_counter() - started, "tensors": len(weights)}


def serve(address: str, authkey: bytes) -> None:
    server = Server()
    with Listener(address, family="AF_UNIX", authkey=authkey) as listener:
        conn = listener.accept()
    with conn:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the trainer closed the connection or died
            op = msg.get("op")
            if op == "close":
                conn.send({"closed": True})
                return
            try:
                handler = {
                    "start": server.start,
                    "generate": server.generate,
                    "load_weights": server.load_weights,
                }[op]
                reply = handler(msg)
            except Exception:  # noqa: BLE001 - every failure goes back to the trainer as text
                reply = {"error": traceback.format_exc(limit=20)}
            conn.send(reply)


if __name__ == "__main__":
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    serve(sys.argv[1], bytes.fromhex(os.environ.pop("CONSPO_VLLM_AUTHKEY")))
    # vLLM's engine may leave non-daemon threads behind: do not wait for them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
