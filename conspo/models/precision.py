"""Numeric precision of a training run: the dtype weights are stored in, the dtype the forward
passes compute in, and the loss scaler float16 needs (``ModelConfig.dtype`` / ``mixed_precision``).

    dtype      mixed_precision  weights   forward                     loss scaling
    float32    either           float32   float32                     no
    bfloat16   off              bfloat16  bfloat16                    no
    bfloat16   on               float32   torch.autocast(bfloat16)    no
    float16    either           float32   torch.autocast(float16)     GradScaler

"auto" is bfloat16 on CUDA and float32 on CPU (conspo.models.loading.pick_device).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import torch

# CPU flags of a native bfloat16 matmul (AVX512-BF16, or AMX tiles); without either, a CPU runs
# bfloat16 through float32 conversions: measured 3-9x slower than float32 on an AVX2-only CPU.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass
class Precision:
    weights: torch.dtype  # what parameters (and so AdamW's state) are stored in
    compute: torch.dtype  # what the forward passes compute in
    device: torch.device
    scaler: torch.amp.GradScaler | None  # float16 only: its gradients underflow without scaling

    @property
    def mixed(self) -> bool:
        return self.weights != self.compute

    def autocast(self) -> AbstractContextManager[object]:
        """The context every forward pass runs in: autocast to ``compute`` when mixed."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_norm: float
    ) -> torch.Tensor:
        """Clip the (unscaled) gradients to ``max_norm`` and step; returns the norm before
        clipping. With a scaler, a step whose gradients overflowed is skipped (its norm is inf)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()
        return grad_norm


def make_precision(compute: torch.dtype, mixed_precision: bool, device: torch.device) -> Precision:
    """``compute``: the resolved model.dtype."""
    if compute == torch.float32:
        return Precision(torch.float32, torch.float32, device, None)
    if compute == torch.float16:
        return Precision(torch.float32, compute, device, torch.amp.GradScaler(device.type))
    weights = torch.float32 if mixed_precision else compute
    return Precision(weights, compute, device, None)


def cpu_bfloat16() -> str | None:
    """Which native bfloat16 instructions this CPU has ("avx512_bf16", "amx_bf16"), "" when it
    has none (bfloat16 is emulated, several times slower than float32), None when unknown (no
    /proc/cpuinfo: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return ", ".join(f for f in NATIVE_BF16_FLAGS if f in flags)


def emulated_bfloat16(device_type: str, dtype: torch.dtype | str) -> str | None:
    """The warning for computing in bfloat16 on a CPU without native bfloat16, else None (a GPU,
    another dtype, a CPU with it, or one whose flags are unknown)."""
    name = str(dtype).removeprefix("torch.")
    if device_type != "cpu" or name != "bfloat16" or cpu_bfloat16() != "":
        return None
    return "no native bfloat16 on this CPU: bfloat16 runs several times slower than float32"


def bfloat16_note() -> str:
    """One line for benches and logs: whether bfloat16 is a speed lever on this CPU."""
    native = cpu_bfloat16()
    if native is None:
        return "CPU bfloat16: unknown (no /proc/cpuinfo)"
    if native:
        return f"CPU bfloat16: native ({native}); whether it is faster depends on the shape"
    return (
        "CPU bfloat16: emulated (no AVX512-BF16 or AMX): bfloat16 runs several times slower"
        " than float32 here; train in float32"
    )
